//! The source's structure, checked: the top-level modules of `src/` form one-way layers (the
//! core imports nothing from the modules built on it, and no import cycle spans more than a
//! few modules), and no source file is too long to read in one sitting. An import is a
//! `crate::<module>` path on a line of code (comments and doc comments do not count), the
//! way a reader following the code would meet it. `cargo test --test layout -- --nocapture`
//! prints the graph's cycles.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The scheduler core: fibers and their stacks, the scheduler with its tasks, the park
/// protocol and wait queue, timers and sleeping, the reactor, the cooperative budget, and
/// the small modules they stand on.
const CORE: &[&str] = &[
    "coop", "error", "fiber", "fork", "io", "join", "park", "report", "sched", "stack", "sys",
    "time",
];

/// Built on the core, reaching it through narrow interfaces; the core imports none of them.
const ABOVE_CORE: &[&str] = &[
    "dump", "exec", "fs", "future", "hook", "join_set", "metrics", "net", "scope", "sync",
    "unblock",
];

/// The largest import cycle among top-level modules this layout allows.
const MAX_CYCLE: usize = 6;

/// No source file is longer than this.
const MAX_LINES: usize = 1_000;

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file of `src/` belongs to (`sched` for `src/sched/worker/mod.rs`).
fn module_of(path: &Path) -> String {
    let rel = path.strip_prefix(src()).expect("under src");
    let first = rel.components().next().expect("a component");
    let name = first.as_os_str().to_string_lossy();
    name.trim_end_matches(".rs").to_string()
}

/// The code of a line: none for comments and doc comments.
fn code(line: &str) -> &str {
    let t = line.trim_start();
    if t.starts_with("//") {
        return "";
    }
    match t.find("//") {
        // A `//` inside a string is rare in this code base and only makes an import look
        // shorter; good enough for counting module paths.
        Some(i) => &t[..i],
        None => t,
    }
}

/// Every top-level module and the top-level modules its files name as `crate::<m>`.
fn import_graph() -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let modules: BTreeSet<String> = files
        .iter()
        .map(|p| module_of(p))
        .filter(|m| m != "lib")
        .collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = modules
        .iter()
        .map(|m| (m.clone(), BTreeSet::new()))
        .collect();
    for file in &files {
        let from = module_of(file);
        if from == "lib" {
            continue;
        }
        let text = std::fs::read_to_string(file).expect("read a source file");
        for line in text.lines() {
            let mut rest = code(line);
            while let Some(i) = rest.find("crate::") {
                rest = &rest[i + "crate::".len()..];
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if name != from && modules.contains(&name) {
                    graph.get_mut(&from).unwrap().insert(name);
                }
            }
        }
    }
    graph
}

/// The strongly connected components of `graph` with more than one module (Tarjan).
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<BTreeSet<String>> {
    struct State<'a> {
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        out: Vec<BTreeSet<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a str) {
        let i = s.index.len();
        s.index.insert(v, i);
        s.low.insert(v, i);
        s.stack.push(v);
        s.on_stack.insert(v);
        for w in &s.graph[v] {
            let w = w.as_str();
            if !s.index.contains_key(w) {
                visit(s, w);
                let low = s.low[v].min(s.low[w]);
                s.low.insert(v, low);
            } else if s.on_stack.contains(w) {
                let low = s.low[v].min(s.index[w]);
                s.low.insert(v, low);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = BTreeSet::new();
            loop {
                let w = s.stack.pop().unwrap();
                s.on_stack.remove(w);
                component.insert(w.to_string());
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                s.out.push(component);
            }
        }
    }
    let mut s = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.out.sort_by_key(|c| std::cmp::Reverse(c.len()));
    s.out
}

#[test]
fn every_top_level_module_is_placed_in_a_layer() {
    let graph = import_graph();
    let unplaced: Vec<&String> = graph
        .keys()
        .filter(|m| !CORE.contains(&m.as_str()) && !ABOVE_CORE.contains(&m.as_str()))
        .collect();
    assert!(
        unplaced.is_empty(),
        "modules in no layer (add them to CORE or ABOVE_CORE): {unplaced:?}"
    );
}

#[test]
fn the_core_imports_nothing_built_on_it() {
    let graph = import_graph();
    let wrong: Vec<String> = CORE
        .iter()
        .filter_map(|m| graph.get(*m).map(|to| (m, to)))
        .flat_map(|(m, to)| {
            to.iter()
                .filter(|t| ABOVE_CORE.contains(&t.as_str()))
                .map(move |t| format!("{m} -> {t}"))
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "the core imports from above it: {wrong:?}"
    );
}

#[test]
fn no_import_cycle_spans_more_than_six_modules() {
    let graph = import_graph();
    let found = cycles(&graph);
    for c in &found {
        println!("cycle of {}: {:?}", c.len(), c);
    }
    let largest = found.first().map_or(0, |c| c.len());
    assert!(
        largest <= MAX_CYCLE,
        "the largest import cycle has {largest} modules: {:?}",
        found.first()
    );
}

#[test]
fn no_source_file_is_over_a_thousand_lines() {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let long: Vec<(usize, String)> = files
        .iter()
        .map(|f| {
            let n = std::fs::read_to_string(f).expect("read").lines().count();
            (n, f.strip_prefix(src()).unwrap().display().to_string())
        })
        .filter(|(n, _)| *n > MAX_LINES)
        .collect();
    assert!(long.is_empty(), "files over {MAX_LINES} lines: {long:?}");
}
