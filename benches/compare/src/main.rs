//! `fibra-compare`: runs the benchmark workloads (see `workloads`) for fibra and its peers
//! (tokio, may, Go, std threads) with the same number of worker threads, prints a table of
//! medians and fibra/peer ratios, and writes `target/bench-report/report.md` and `report.svg`.
//!
//! ```text
//! cargo run --release -p fibra-compare -- [--threads N] [--reps R] [--only w1,w2] [--install]
//! ```
//!
//! Every (workload, peer) runs in a fresh child process (this binary re-executed with the hidden
//! `__run` subcommand, or the Go program), so runtimes are torn down between workloads, may's
//! process-global runtime can be configured each time, a crash or hang costs one cell of the
//! table (each child has a time limit), and memory/CPU figures start clean. `idle_cpu` and
//! `park_memory` even use a fresh process per repetition. http servers run as `__serve`
//! children loaded by `wrk`. fibra's http servers and its redis_get client are the fibra
//! crate's examples, built by the parent (the hooked ones with `--features hook`, which must
//! not be compiled into this binary: it would reroute the other peers' system calls too).

mod cli;
mod driver;
mod measure;
mod plot;
mod report;
mod rt;
mod workloads;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::SystemTime;

use cli::Args;
use driver::Env;
use report::{Meta, Row};
use workloads::{Peer, Workload, WORKLOADS};

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().collect();
    let args = match cli::parse(&argv[1..]) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("fibra-compare: {e}\n\n{}", cli::usage());
            return ExitCode::from(2);
        }
    };
    match args {
        Args::Help => {
            println!("{}", cli::usage());
            ExitCode::SUCCESS
        }
        Args::Child {
            peer,
            workload,
            cfg,
        } => child(peer, &workload, cfg),
        Args::Serve {
            peer,
            port,
            threads,
        } => match workloads::http::serve(peer, port, threads) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("serve: {e}");
                ExitCode::FAILURE
            }
        },
        Args::Compare(opts) => compare(&opts, &argv),
    }
}

/// Hidden `__run` mode: runs one workload for one peer in this process, printing per
/// repetition `value <f>` and an `also <row> <f>` line for each row derived from the workload,
/// or `skip <reason>`.
fn child(peer: Peer, workload: &str, cfg: workloads::Cfg) -> ExitCode {
    exit_on_panic();
    match workloads::run(peer, workload, cfg) {
        Ok(reps) => {
            for figures in reps {
                println!("value {}", figures.value);
                for (row, v) in figures.also {
                    println!("also {row} {v}");
                }
            }
            ExitCode::SUCCESS
        }
        Err(why) => {
            println!("skip {why}");
            ExitCode::SUCCESS
        }
    }
}

/// In a child, any panic (on any thread, in any task) means the figure is lost: report it and
/// leave at once. Without this a panic on a runtime's worker can leave the process waiting
/// forever, and the parent would only notice at the time limit. The message is printed without
/// std's default hook on purpose: with `RUST_BACKTRACE` set, that hook allocates to capture a
/// backtrace, which fails (and hangs the abort) when the panic was itself an mmap failure.
fn exit_on_panic() {
    std::panic::set_hook(Box::new(|info| {
        let msg = info
            .payload()
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| info.payload().downcast_ref::<String>().map(String::as_str))
            .unwrap_or("(non-string panic payload)");
        let thread = std::thread::current();
        let name = thread.name().unwrap_or("<unnamed>");
        match info.location() {
            Some(at) => eprintln!("thread '{name}' panicked at {at}:\n{msg}"),
            None => eprintln!("thread '{name}' panicked:\n{msg}"),
        }
        let _ = std::io::Write::flush(&mut std::io::stdout());
        // SAFETY: `_exit` ends the process without running atexit handlers or destructors,
        // which is the point: other threads may hold locks those would need. Nothing here
        // relies on cleanup (the parent reads our pipes, which the kernel closes).
        unsafe { libc::_exit(101) };
    }));
}

fn compare(opts: &cli::Options, argv: &[String]) -> ExitCode {
    if opts.install {
        install_peers();
    }
    let target = target_dir();
    let report_dir = target.join("bench-report");
    let scratch = target.join("bench-compare");
    for dir in [&report_dir, &scratch] {
        if let Err(e) = std::fs::create_dir_all(dir) {
            eprintln!("cannot create {}: {e}", dir.display());
            return ExitCode::FAILURE;
        }
    }
    let env = Env {
        threads: opts.threads,
        reps: opts.reps,
        self_exe: std::env::current_exe().expect("path of this executable"),
        go: match std::env::var_os("FIBRA_COMPARE_GO_BENCH") {
            // A machine without the Go toolchain can run a go-bench built elsewhere.
            Some(bin) => driver::prebuilt_go(Path::new(&bin)),
            None => driver::build_go(&scratch),
        },
        wrk: driver::which("wrk")
            .ok_or_else(|| "`wrk` is not on PATH (install with --install)".into()),
        redis_server: driver::which("redis-server")
            .ok_or_else(|| "`redis-server` is not on PATH (install with --install)".into()),
        scratch,
    };
    if let Err(why) = &env.go {
        eprintln!("go: skipped: {why}");
    }

    let selected: Vec<&Workload> = WORKLOADS
        .iter()
        .filter(|w| opts.only.as_ref().is_none_or(|o| w.selected(o)))
        .collect();
    // What does not change during the run is read once (the tools' versions run programs).
    let fixed = Meta {
        date: String::new(),
        cpus: std::thread::available_parallelism()
            .map(|n| n.to_string())
            .unwrap_or_else(|_| "?".into()),
        cpu_model: cpu_model(),
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "?".into()),
        command: argv.join(" "),
        threads: opts.threads,
        reps: opts.reps,
        tools: tool_versions(&env),
        not_run: Vec::new(),
    };
    let meta = |finished: usize| Meta {
        date: report::utc(
            SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
        ),
        not_run: selected[finished..].iter().map(|w| w.name).collect(),
        ..fixed.clone()
    };
    let md_path = report_dir.join("report.md");
    let svg_path = report_dir.join("report.svg");

    let mut rows: Vec<Row> = Vec::new();
    for (i, &w) in selected.iter().enumerate() {
        let mut done = |run: &driver::PeerRun| {
            eprintln!(
                "{:<16} {:<9} {}",
                w.name,
                run.peer.name(),
                progress(run, w.unit)
            );
        };
        let runs = if w.mode == workloads::Mode::Derived {
            // The registry lists a derived row after the workload whose runs it reads, and
            // `selected` keeps that workload whenever the row is kept.
            let of = w.of.expect("a derived row names its workload");
            let Some(parent) = rows.iter().find(|r| r.workload.name == of) else {
                continue;
            };
            let runs = driver::derive(w, &parent.runs);
            runs.iter().for_each(&mut done);
            runs
        } else {
            let peers: Vec<Peer> = Peer::ALL
                .into_iter()
                .filter(|&p| workloads::applies(p, w.name))
                .collect();
            driver::run_workload(&env, w, &peers, &mut done)
        };
        rows.push(Row { workload: w, runs });
        // A run stopped early (a time limit, a crash of this process) keeps what it measured.
        if i + 1 < selected.len() {
            let _ = write_report(&rows, &meta(i + 1), &md_path, &svg_path);
        }
    }

    println!();
    print!("{}", report::text_table(&rows));
    println!("\n{}\n", report::LEGEND);
    for r in report::remarks(&rows) {
        println!("  {r}");
    }

    let ok = write_report(&rows, &meta(selected.len()), &md_path, &svg_path);
    println!("\nwrote {} and {}", md_path.display(), svg_path.display());
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Writes `report.md` and `report.svg`; says on stderr what could not be written.
fn write_report(rows: &[Row], meta: &Meta, md_path: &Path, svg_path: &Path) -> bool {
    let mut ok = true;
    if let Err(e) = std::fs::write(md_path, report::markdown(rows, meta)) {
        eprintln!("cannot write {}: {e}", md_path.display());
        ok = false;
    }
    if let Err(e) = plot::draw(rows, svg_path) {
        eprintln!("cannot draw {}: {e}", svg_path.display());
        ok = false;
    }
    ok
}

/// One progress line on stderr per finished cell.
fn progress(run: &driver::PeerRun, unit: &str) -> String {
    match &run.status {
        driver::Status::Ok => format!(
            "{} {unit}  (samples: {})",
            run.median().map(report::fmt_value).unwrap_or_default(),
            run.samples
                .iter()
                .map(|&v| report::fmt_value(v))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        driver::Status::Skipped(why) => format!("skipped: {why}"),
        driver::Status::Failed(why) => format!("FAILED: {why}"),
    }
}

/// `--install`: Debian's Go toolchain, wrk and redis-server, as in `ci/install-bench-peers.sh`.
fn install_peers() {
    eprintln!("installing golang-go, wrk and redis-server with apt-get");
    let status = Command::new("sh")
        .args([
            "-c",
            "apt-get update && apt-get install -y golang-go wrk redis-server",
        ])
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => eprintln!("install failed ({s}); missing peers will be reported as skipped"),
        Err(e) => eprintln!("cannot run apt-get: {e}; missing peers will be reported as skipped"),
    }
}

/// `CARGO_TARGET_DIR` (relative paths taken from the workspace root) or `<workspace>/target`.
fn target_dir() -> PathBuf {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let workspace = workspace.canonicalize().unwrap_or(workspace);
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => workspace.join(dir),
        None => workspace.join("target"),
    }
}

/// The first "model name" line of /proc/cpuinfo.
fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

/// Versions of the external peers, for the report.
fn tool_versions(env: &Env) -> Vec<String> {
    let first_line = |prog: &Path, arg: &str| {
        Command::new(prog)
            .arg(arg)
            .output()
            .ok()
            .map(|o| {
                let text = String::from_utf8_lossy(if o.stdout.is_empty() {
                    &o.stderr
                } else {
                    &o.stdout
                })
                .into_owned();
                text.lines().next().unwrap_or("").trim().to_string()
            })
            .unwrap_or_default()
    };
    let mut tools = vec![format!(
        "Rust peers: versions pinned in the workspace Cargo.lock (tokio 1.x, may 0.3.x, redis 1.x)"
    )];
    match (&env.go, driver::which("go")) {
        (Ok(bin), _) if std::env::var_os("FIBRA_COMPARE_GO_BENCH").is_some() => {
            tools.push(format!("Go: prebuilt program {}", bin.display()))
        }
        (Ok(_), Some(go)) => tools.push(format!("Go: {}", first_line(&go, "version"))),
        (Err(why), _) => tools.push(format!("Go: skipped ({why})")),
        _ => {}
    }
    match &env.wrk {
        Ok(wrk) => tools.push(format!("wrk: {}", first_line(wrk, "--version"))),
        Err(why) => tools.push(format!("wrk: skipped ({why})")),
    }
    match &env.redis_server {
        Ok(redis) => tools.push(format!("redis-server: {}", first_line(redis, "--version"))),
        Err(why) => tools.push(format!("redis-server: skipped ({why})")),
    }
    tools
}
