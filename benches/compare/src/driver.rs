//! The parent side: runs every (workload, peer) in a child process with a time limit (re-exec of
//! this binary with the hidden `__run`/`__serve` subcommands, the Go program, or one of the
//! fibra crate's examples), builds the Go program and those examples, drives `wrk` for the http
//! workloads, starts `redis-server` for redis_get, and collects one [`PeerRun`] per cell of the
//! table.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::workloads::{self, Example, Mode, Peer, Threads, Workload};

/// What happened to one peer on one workload.
#[derive(Clone, Debug, PartialEq)]
pub enum Status {
    Ok,
    Skipped(String),
    Failed(String),
}

/// One cell of the results table: status, the figure of every repetition, and notes (how the
/// figure was obtained when that differs from the other peers, warnings seen while measuring).
#[derive(Clone, Debug)]
pub struct PeerRun {
    pub peer: Peer,
    pub status: Status,
    pub samples: Vec<f64>,
    pub notes: Vec<String>,
    /// The figures the same repetitions gave for the rows derived from this workload
    /// ([`Mode::Derived`]), by row name; [`derive`] makes those rows' cells from them.
    pub also: Vec<(String, Vec<f64>)>,
}

impl PeerRun {
    fn skipped(peer: Peer, why: impl Into<String>) -> PeerRun {
        PeerRun {
            status: Status::Skipped(why.into()),
            ..PeerRun::ok(peer)
        }
    }

    /// A cell about to collect samples.
    fn ok(peer: Peer) -> PeerRun {
        PeerRun {
            peer,
            status: Status::Ok,
            samples: Vec::new(),
            notes: Vec::new(),
            also: Vec::new(),
        }
    }

    /// Adds one repetition's figure for the derived row `row`.
    fn push_also(&mut self, row: &str, v: f64) {
        match self.also.iter_mut().find(|(r, _)| r == row) {
            Some((_, samples)) => samples.push(v),
            None => self.also.push((row.to_string(), vec![v])),
        }
    }

    fn is_ok(&self) -> bool {
        matches!(self.status, Status::Ok)
    }

    pub fn median(&self) -> Option<f64> {
        match self.status {
            Status::Ok => crate::measure::median(&self.samples),
            _ => None,
        }
    }
}

/// Everything the parent needs to start children.
pub struct Env {
    pub threads: usize,
    pub reps: usize,
    /// This binary, re-executed for `__run` / `__serve`.
    pub self_exe: PathBuf,
    /// The built Go program, or why Go cannot run.
    pub go: Result<PathBuf, String>,
    /// `wrk`, or why http cannot run.
    pub wrk: Result<PathBuf, String>,
    /// `redis-server`, or why redis_get cannot run.
    pub redis_server: Result<PathBuf, String>,
    /// Scratch directory (server logs), under the target directory.
    pub scratch: PathBuf,
}

/// Looks a program up on `PATH`.
pub fn which(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

/// The worker threads of every peer's runtime for `w`.
fn threads(env: &Env, w: &Workload) -> usize {
    match w.threads {
        Threads::Run => env.threads,
        Threads::One => 1,
    }
}

/// The cells of derived row `w`, one per cell of its workload's row (`parent`): the figures
/// those runs reported for `w`, or the parent cell's status when it did not run. A run that
/// succeeded without a figure for every repetition fails here, named.
pub fn derive(w: &Workload, parent: &[PeerRun]) -> Vec<PeerRun> {
    parent
        .iter()
        .map(|p| {
            let mut run = PeerRun::ok(p.peer);
            if !p.is_ok() {
                run.status = p.status.clone();
                return run;
            }
            match p.also.iter().find(|(row, _)| row == w.name) {
                Some((_, samples)) if samples.len() == p.samples.len() => {
                    run.samples = samples.clone();
                }
                got => {
                    run.status = Status::Failed(format!(
                        "{} figures for {} reps of {}",
                        got.map_or(0, |(_, s)| s.len()),
                        p.samples.len(),
                        w.of.unwrap_or("its workload"),
                    ));
                }
            }
            run
        })
        .collect()
}

/// Builds `benches/compare/go` into `out_dir/go-bench` with the Go toolchain on `PATH`.
pub fn build_go(out_dir: &Path) -> Result<PathBuf, String> {
    let go = which("go").ok_or("`go` is not on PATH (install with --install)")?;
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("go");
    let bin = out_dir.join("go-bench");
    let out = Command::new(go)
        .args(["build", "-o"])
        .arg(&bin)
        .arg(".")
        .current_dir(&src)
        .env("GOTOOLCHAIN", "local")
        .env("GOFLAGS", "-mod=mod")
        .env("GOCACHE", out_dir.join("go-cache"))
        .env("GOPATH", out_dir.join("go-path"))
        .output()
        .map_err(|e| format!("cannot run go: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "go build failed: {}",
            last_line(&String::from_utf8_lossy(&out.stderr))
        ));
    }
    Ok(bin)
}

/// A go-bench built elsewhere (`FIBRA_COMPARE_GO_BENCH`), for a machine without the Go
/// toolchain: checked to run (`-h` prints usage and exits) before any workload uses it.
pub fn prebuilt_go(bin: &Path) -> Result<PathBuf, String> {
    let out = Command::new(bin)
        .arg("-h")
        .output()
        .map_err(|e| format!("cannot run {}: {e}", bin.display()))?;
    let text = String::from_utf8_lossy(&out.stderr);
    if !text.contains("-w") {
        return Err(format!(
            "{} does not look like go-bench: {}",
            bin.display(),
            last_line(&text)
        ));
    }
    Ok(bin.to_path_buf())
}

/// A `redis-server` child on a free loopback port, without persistence; killed when dropped.
struct RedisServer {
    child: Child,
    port: u16,
}

impl RedisServer {
    fn start(bin: &Path, scratch: &Path) -> Result<RedisServer, String> {
        let port = free_port().map_err(|e| format!("no free port: {e}"))?;
        let log = scratch.join("redis-server.log");
        let mut cmd = Command::new(bin);
        cmd.args(["--save", "", "--appendonly", "no"])
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .arg("--dir")
            .arg(scratch);
        let child =
            spawn_logged(&mut cmd, &log).map_err(|e| format!("cannot start redis-server: {e}"))?;
        let mut server = RedisServer { child, port };
        let start = Instant::now();
        let mut last = String::from("no connection");
        while start.elapsed() < SERVER_READY {
            if let Ok(Some(status)) = server.child.try_wait() {
                let out = std::fs::read_to_string(&log).unwrap_or_default();
                return Err(format!(
                    "redis-server exited ({status}): {}",
                    last_line(&out)
                ));
            }
            match redis_ping(port) {
                Ok(()) => return Ok(server),
                Err(e) => last = e,
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(format!(
            "redis-server did not answer PING within {SERVER_READY:?}: {last}"
        ))
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        kill(&mut self.child);
    }
}

/// Sends one PING in Redis's protocol and expects PONG.
fn redis_ping(port: u16) -> Result<(), String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(2)))
        .map_err(|e| e.to_string())?;
    s.write_all(b"*1\r\n$4\r\nPING\r\n")
        .map_err(|e| e.to_string())?;
    let mut buf = [0u8; 64];
    let mut got = Vec::new();
    while !got.ends_with(b"\r\n") {
        let n = s.read(&mut buf).map_err(|e| e.to_string())?;
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
    }
    if got == b"+PONG\r\n" {
        Ok(())
    } else {
        Err(format!(
            "unexpected answer to PING: {:?}",
            String::from_utf8_lossy(&got)
        ))
    }
}

/// Runs workload `w` for each of `peers` and returns their cells in that order; `done` gets
/// each cell as soon as it is final.
///
/// Every workload interleaves its peers. A shared machine's speed drifts over seconds to
/// minutes; run back to back, one peer could get a slow stretch and another a fast one, and
/// their ratio would measure the drift. Interleaved, every peer samples the same stretches:
/// - timed workloads run in up to `TIMED_ROUNDS` rounds, each a child per peer with its own
///   warm-up and a share of the repetitions;
/// - fresh-per-repetition workloads run a round per repetition, a child per peer in each;
/// - the server workloads (the http rows, redis_get) start every server first (or the
///   one redis-server), then run repetition k of every peer before repetition k + 1 of any.
pub fn run_workload(
    env: &Env,
    w: &Workload,
    peers: &[Peer],
    done: &mut dyn FnMut(&PeerRun),
) -> Vec<PeerRun> {
    match w.mode {
        Mode::Derived => unreachable!("a derived row has no runs of its own (see derive)"),
        Mode::Timed | Mode::FreshPerRep | Mode::Http | Mode::Redis => {
            let mut runs: Vec<PeerRun> = peers
                .iter()
                .map(|&peer| unavailable(env, w, peer).unwrap_or_else(|| PeerRun::ok(peer)))
                .collect();
            match w.mode {
                Mode::Http => http_rounds(env, w, &mut runs),
                Mode::Redis => redis_rounds(env, w, &mut runs),
                _ => child_rounds(env, w, &mut runs),
            }
            for run in &mut runs {
                add_note(run, w);
                run.notes.dedup();
                done(run);
            }
            runs
        }
    }
}

/// The cell of a peer that cannot run `w`, by design or because a tool is missing.
fn unavailable(env: &Env, w: &Workload, peer: Peer) -> Option<PeerRun> {
    if let Some(why) = workloads::skip_reason(peer, w.name) {
        return Some(PeerRun::skipped(peer, why));
    }
    if w.pinned && pinned_cpus().is_none() {
        return Some(PeerRun::skipped(
            peer,
            "needs two CPUs, one for wrk and one for the server",
        ));
    }
    let tool = match w.mode {
        Mode::Http => env.wrk.as_ref().err(),
        Mode::Redis => env.redis_server.as_ref().err(),
        Mode::Timed | Mode::FreshPerRep | Mode::Derived => None,
    };
    let go = if peer == Peer::Go {
        env.go.as_ref().err()
    } else {
        None
    };
    go.or(tool).map(|why| PeerRun::skipped(peer, why.clone()))
}

fn add_note(run: &mut PeerRun, w: &Workload) {
    if let Some(note) = workloads::note(run.peer, w.name) {
        run.notes.insert(0, note.to_string());
    }
    let skipped = matches!(run.status, Status::Skipped(_));
    if let (true, false, Some((load, server))) = (w.pinned, skipped, pinned_cpus()) {
        run.notes.push(format!(
            "{}: wrk pinned to CPU {load}, the server to CPU {server}",
            run.peer.name()
        ));
    }
}

/// The CPUs of a pinned server row: (wrk's, the server's), the first two this process may run
/// on; `None` if it may run on fewer.
fn pinned_cpus() -> Option<(usize, usize)> {
    // SAFETY: an all-zero `cpu_set_t` is a valid, empty set, which `sched_getaffinity` fills
    // (it writes at most the size given).
    let set = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return None;
        }
        set
    };
    // SAFETY: `CPU_ISSET` reads bit `c` of a valid set, `c` below `CPU_SETSIZE`.
    let mut cpus = (0..libc::CPU_SETSIZE as usize).filter(|&c| unsafe { libc::CPU_ISSET(c, &set) });
    Some((cpus.next()?, cpus.next()?))
}

/// Makes the process `cmd` starts run on `cpu` alone.
fn pin(cmd: &mut Command, cpu: usize) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the child between fork and exec; it builds a set on its
    // stack and makes one system call, both async-signal-safe, and allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Rounds of a timed workload: at most this many, so that each child still runs several
/// repetitions on one warmed-up runtime (a child's start and warm-up cost as much as a
/// repetition or more).
const TIMED_ROUNDS: usize = 3;

/// A timed or fresh-per-repetition workload, in rounds: in each, every peer still running
/// runs one child. A timed workload's repetitions are dealt over `min(reps, TIMED_ROUNDS)`
/// rounds (5 as 2 + 2 + 1), each child with its own warm-up; a fresh-per-repetition workload
/// runs one repetition per round, without warm-up. The order of the peers turns by one each
/// round, so that no peer always runs first. The first million_park child after a pause
/// takes much longer than the next ones, whichever peer it is (most likely the kernel
/// finding the gigabytes of pages a million parked tasks touch), and turning alone would
/// still leave it in the figures of the first round's first peer, so a fresh-per-repetition
/// workload first runs one child whose figures nobody keeps. A peer's first failure ends its
/// cell (with the figures it had), as it would run back to back.
fn child_rounds(env: &Env, w: &Workload, runs: &mut [PeerRun]) {
    let (rounds, warmup) = match w.mode {
        Mode::FreshPerRep => (env.reps, false),
        _ => (env.reps.min(TIMED_ROUNDS), true),
    };
    if w.mode == Mode::FreshPerRep {
        if let Some(run) = runs.iter().find(|r| r.is_ok()) {
            // Settling only: a failure here shows again, and counts, in the rounds below.
            let _ = child_run(env, w, run.peer, 1, false, None);
        }
    }
    for round in 0..rounds {
        let reps = match w.mode {
            Mode::FreshPerRep => 1,
            _ => env.reps / rounds + usize::from(round < env.reps % rounds),
        };
        let n = runs.len();
        for k in 0..n {
            let run = &mut runs[(round + k) % n];
            if !run.is_ok() {
                continue;
            }
            match child_run(env, w, run.peer, reps, warmup, None) {
                Ok(figures) => figures.add_to(run),
                Err(status) => run.status = status,
            }
        }
    }
}

/// redis_get: starts one redis-server, then runs R rounds; in each, every peer runs one child
/// (connections, SET, one untimed warm-up, one timed repetition) against it.
fn redis_rounds(env: &Env, w: &Workload, runs: &mut [PeerRun]) {
    if !runs.iter().any(PeerRun::is_ok) {
        return;
    }
    let bin = env.redis_server.as_ref().expect("checked by unavailable()");
    let server = match RedisServer::start(bin, &env.scratch) {
        Ok(s) => s,
        Err(e) => {
            for run in runs.iter_mut().filter(|r| r.is_ok()) {
                run.status = Status::Failed(e.clone());
            }
            return;
        }
    };
    for _ in 0..env.reps {
        for run in runs.iter_mut().filter(|r| r.is_ok()) {
            match child_run(env, w, run.peer, 1, true, Some(server.port)) {
                Ok(reps) => reps.add_to(run),
                Err(status) => run.status = status,
            }
        }
    }
    drop(server);
}

/// The command that runs `w` for `peer` in a fresh process: the Go program, one of fibra's
/// examples (built first; they take the same `--threads`, `--reps`, `--no-warmup` and `--port`
/// as `__run`), or this binary's `__run`. `port`: the server the workload talks to.
fn workload_command(
    env: &Env,
    w: &Workload,
    peer: Peer,
    reps: usize,
    warmup: bool,
    port: Option<u16>,
) -> Result<Command, String> {
    let mut cmd;
    if peer == Peer::Go {
        cmd = Command::new(env.go.as_ref().expect("checked by caller"));
        cmd.args(["-w", w.program(), "-reps", &reps.to_string()])
            .arg(format!("-warmup={warmup}"))
            .env("GOMAXPROCS", threads(env, w).to_string());
        return Ok(cmd);
    }
    if let Some(example) = workloads::fibra_example(peer, w.name) {
        cmd = Command::new(build_example(&env.self_exe, example)?);
        if w.name == "redis_get" {
            use workloads::redis_get::{CONNECTIONS, GETS};
            cmd.args(["--connections", &CONNECTIONS.to_string()])
                .args(["--gets", &GETS.to_string()]);
        }
    } else {
        cmd = Command::new(&env.self_exe);
        cmd.args(["__run", peer.name(), w.program()]);
    }
    cmd.args(["--threads", &threads(env, w).to_string()])
        .args(["--reps", &reps.to_string()]);
    if !warmup {
        cmd.arg("--no-warmup");
    }
    if let Some(port) = port {
        cmd.args(["--port", &port.to_string()]);
    }
    Ok(cmd)
}

/// The figures of one child: one `value` per repetition, and the `also` lines for the rows
/// derived from the workload.
#[derive(Default)]
struct Reps {
    values: Vec<f64>,
    also: Vec<(String, f64)>,
}

impl Reps {
    fn add_to(self, run: &mut PeerRun) {
        run.samples.extend(self.values);
        for (row, v) in self.also {
            run.push_also(&row, v);
        }
    }
}

/// Result of one child: its figures, or skipped/failed with a reason.
type ChildResult = Result<Reps, Status>;

fn child_run(
    env: &Env,
    w: &Workload,
    peer: Peer,
    reps: usize,
    warmup: bool,
    port: Option<u16>,
) -> ChildResult {
    let cmd = workload_command(env, w, peer, reps, warmup, port).map_err(Status::Failed)?;
    let out = run_limited(cmd, w.limit).map_err(Status::Failed)?;
    let figure = |v: &str| {
        v.trim()
            .parse::<f64>()
            .map_err(|e| Status::Failed(format!("bad figure {v:?} from child: {e}")))
    };
    let mut reps_out = Reps::default();
    for line in out.stdout.lines() {
        if let Some(v) = line.strip_prefix("value ") {
            reps_out.values.push(figure(v)?);
        } else if let Some(rest) = line.strip_prefix("also ") {
            let (row, v) = rest
                .trim()
                .split_once(' ')
                .ok_or_else(|| Status::Failed(format!("bad line from child: {line:?}")))?;
            reps_out.also.push((row.to_string(), figure(v)?));
        } else if let Some(why) = line.strip_prefix("skip ") {
            return Err(Status::Skipped(why.to_string()));
        }
    }
    let values = &reps_out.values;
    if !out.status.success() || values.len() != reps {
        let how = match out.status.code() {
            Some(code) => format!("exit code {code}"),
            None => describe_signal(out.status),
        };
        return Err(Status::Failed(
            format!(
                "{how} after {}/{reps} reps: {}",
                values.len(),
                last_line(&out.stderr)
            ) + &hint(&out.stderr),
        ));
    }
    Ok(reps_out)
}

/// An explanation for failures whose cause is known and not obvious from the message.
fn hint(stderr: &str) -> String {
    if stderr.contains("failed to alloc sys stack") {
        let max = std::fs::read_to_string("/proc/sys/vm/max_map_count").unwrap_or_default();
        format!(
            " (each may stack is its own mmap plus a guard page; vm.max_map_count = {} caps \
             live coroutines near half of that)",
            max.trim()
        )
    } else {
        String::new()
    }
}

/// Captured output of a finished child.
struct Output {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

/// Runs `cmd` to completion, killing it if it outlives `limit`.
fn run_limited(mut cmd: Command, limit: Duration) -> Result<Output, String> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start {:?}: {e}", cmd.get_program()))?;
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            break Some(status);
        }
        if start.elapsed() > limit {
            kill(&mut child);
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let (stdout, stderr) = (join(stdout), join(stderr));
    match status {
        Some(status) => Ok(Output {
            status,
            stdout,
            stderr,
        }),
        None => Err(format!(
            "timed out after {} s (killed); last output: {}",
            limit.as_secs(),
            last_line(&stderr)
        )),
    }
}

fn drain(pipe: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(mut p) = pipe {
            let mut bytes = Vec::new();
            let _ = p.read_to_end(&mut bytes);
            s = String::from_utf8_lossy(&bytes).into_owned();
        }
        s
    })
}

fn join(h: std::thread::JoinHandle<String>) -> String {
    h.join().unwrap_or_default()
}

/// Kills a child this driver started (by its own handle) and reaps it.
fn kill(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

fn describe_signal(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match status.signal() {
        Some(libc::SIGSEGV) => "killed by SIGSEGV".into(),
        Some(libc::SIGABRT) => "aborted (SIGABRT)".into(),
        Some(libc::SIGKILL) => "killed by SIGKILL (out of memory?)".into(),
        Some(sig) => format!("killed by signal {sig}"),
        None => format!("{status}"),
    }
}

/// The most telling line of a failed process's output: the first Rust panic's location and
/// message (the root cause; later panics are usually its consequences),
/// otherwise the last line that is not one of std's "note: …backtrace" hints.
pub fn last_line(s: &str) -> String {
    let lines: Vec<&str> = s.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    let is_hint = |l: &&str| l.starts_with("note:") || l.contains("backtrace");
    let line = match lines.iter().position(|l| l.contains("panicked at")) {
        Some(i) => {
            let msg = lines.get(i + 1).filter(|l| !is_hint(l)).unwrap_or(&"");
            format!("{} {msg}", lines[i])
        }
        None => lines
            .iter()
            .rev()
            .find(|l| !is_hint(l))
            .map(|l| l.to_string())
            .unwrap_or_else(|| "(no output)".into()),
    };
    match line.char_indices().nth(300) {
        Some((cut, _)) => format!("{}…", &line[..cut]),
        None => line,
    }
}

/// How long a server gets to start answering.
const SERVER_READY: Duration = Duration::from_secs(10);
/// wrk's arguments: one thread, 100 connections, 5 s per repetition; `--latency` adds the
/// percentiles that the `<workload>_p50` and `_p99` rows report.
const WRK_ARGS: [&str; 4] = ["-t1", "-c100", "-d5s", "--latency"];
/// The latency percentiles wrk prints that become rows: (percentile, row suffix).
const WRK_PERCENTILES: [(f64, &str); 2] = [(50.0, "_p50"), (99.0, "_p99")];

/// The http rows: starts every peer's server, warms each up with `wrk -d1s`, then runs R
/// rounds of `wrk` over them, and stops them.
fn http_rounds(env: &Env, w: &Workload, runs: &mut [PeerRun]) {
    if !runs.iter().any(PeerRun::is_ok) {
        return;
    }
    let wrk = env.wrk.as_ref().expect("checked by unavailable()");
    let wrk_cpu = if w.pinned {
        pinned_cpus().map(|(load, _)| load)
    } else {
        None
    };
    let mut servers: Vec<Option<HttpServer>> = runs
        .iter_mut()
        .map(|run| {
            if !run.is_ok() {
                return None;
            }
            HttpServer::start(env, w, run.peer)
                .map_err(|e| run.status = Status::Failed(e))
                .ok()
        })
        .collect();
    let mut round = |args: &[&str], keep: bool| {
        for (run, slot) in runs.iter_mut().zip(servers.iter_mut()) {
            let Some(server) = slot else { continue };
            match server.load(wrk, args, wrk_cpu) {
                Ok(load) if keep => {
                    run.samples.push(load.rps);
                    for (pct, suffix) in WRK_PERCENTILES {
                        let row = format!("{}{suffix}", w.name);
                        match load.latency_ms(pct) {
                            Some(ms) => run.push_also(&row, ms),
                            None => run
                                .notes
                                .push(format!("wrk printed no {pct}% latency for {row}")),
                        }
                    }
                    run.notes.extend(load.warnings);
                }
                Ok(_) => {}
                Err(e) => {
                    run.status = Status::Failed(e);
                    *slot = None;
                }
            }
        }
    };
    round(&["-t1", "-c100", "-d1s"], false);
    for _ in 0..env.reps {
        round(&WRK_ARGS, true);
    }
    drop(servers);
}

/// A peer's http server child on a free loopback port; killed when dropped.
struct HttpServer {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl HttpServer {
    /// Starts `peer`'s server for `w` (`__serve <peer>`, the Go program, or one of fibra's
    /// examples, built first) and checks one response by hand.
    fn start(env: &Env, w: &Workload, peer: Peer) -> Result<HttpServer, String> {
        let port = free_port().map_err(|e| format!("no free port: {e}"))?;
        let log = env.scratch.join(format!("{}-{}.log", w.name, peer.name()));
        let mut cmd = if let Some(example) = workloads::fibra_example(peer, w.name) {
            let mut c = Command::new(build_example(&env.self_exe, example)?);
            c.args(["--port", &port.to_string()])
                .args(["--threads", &threads(env, w).to_string()]);
            c
        } else if peer == Peer::Go {
            let mut c = Command::new(env.go.as_ref().expect("checked by caller"));
            c.args(["-w", "http", "-port", &port.to_string()])
                .env("GOMAXPROCS", threads(env, w).to_string());
            c
        } else {
            let mut c = Command::new(&env.self_exe);
            c.args(["__serve", peer.name(), "--port", &port.to_string()])
                .args(["--threads", &threads(env, w).to_string()]);
            c
        };
        if w.pinned {
            let (_, cpu) = pinned_cpus().expect("checked by unavailable()");
            pin(&mut cmd, cpu);
        }
        let child =
            spawn_logged(&mut cmd, &log).map_err(|e| format!("cannot start server: {e}"))?;
        let mut server = HttpServer { child, port, log };
        wait_ready(&mut server.child, port, &server.log)?;
        Ok(server)
    }

    /// Runs wrk once against this server, which must still be running.
    fn load(&mut self, wrk: &Path, args: &[&str], cpu: Option<usize>) -> Result<WrkRun, String> {
        if let Ok(Some(status)) = self.child.try_wait() {
            let out = std::fs::read_to_string(&self.log).unwrap_or_default();
            return Err(format!("server exited ({status}): {}", last_line(&out)));
        }
        wrk_once(wrk, args, &format!("http://127.0.0.1:{}/", self.port), cpu)
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        kill(&mut self.child);
    }
}

/// Builds one of the workspace's example programs with its features and this binary's profile (so
/// into the same target directory) and returns its path (where there is no cargo, the one
/// already built next to this binary); once per run, as redis_get starts
/// its example once per repetition. Cargo keeps the fibra library built with and without
/// `hook` side by side, so switching between them costs no rebuild.
fn build_example(self_exe: &Path, example: Example) -> Result<PathBuf, String> {
    static BUILT: Mutex<Vec<(&str, PathBuf)>> = Mutex::new(Vec::new());
    let name = example.name;
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, bin)) = built.iter().find(|(n, _)| *n == name) {
        return Ok(bin.clone());
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "--quiet", "-p", example.package, "--example", name])
        .current_dir(root);
    if !example.features.is_empty() {
        cmd.args(["--features", &example.features.join(",")]);
    }
    if !cfg!(debug_assertions) {
        cmd.arg("--release");
    }
    let bin = self_exe.parent().map(|dir| dir.join("examples").join(name));
    let out = match cmd.output() {
        Ok(out) => out,
        // No cargo here (a machine that was sent the built binaries): use the example built
        // next to this binary, if it was sent too.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let bin = bin
                .filter(|p| p.is_file())
                .ok_or_else(|| format!("no cargo to build examples/{name}, and no built one"))?;
            built.push((name, bin.clone()));
            return Ok(bin);
        }
        Err(e) => return Err(format!("cannot run cargo to build examples/{name}: {e}")),
    };
    if !out.status.success() {
        return Err(format!(
            "cargo build --example {name} failed: {}",
            last_line(&String::from_utf8_lossy(&out.stderr))
        ));
    }
    let bin = bin
        .filter(|p| p.is_file())
        .ok_or_else(|| format!("built examples/{name} but cannot find it next to this binary"))?;
    built.push((name, bin.clone()));
    Ok(bin)
}

fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Waits until the server answers one GET with "200 OK" and the hello body.
fn wait_ready(server: &mut Child, port: u16, log: &Path) -> Result<(), String> {
    let start = Instant::now();
    let mut last = String::from("no connection");
    while start.elapsed() < SERVER_READY {
        if let Ok(Some(status)) = server.try_wait() {
            let out = std::fs::read_to_string(log).unwrap_or_default();
            return Err(format!("server exited ({status}): {}", last_line(&out)));
        }
        match probe(port) {
            Ok(()) => return Ok(()),
            Err(e) => last = e,
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(format!("server not ready after {SERVER_READY:?}: {last}"))
}

fn probe(port: u16) -> Result<(), String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(2)))
        .map_err(|e| e.to_string())?;
    s.write_all(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .map_err(|e| e.to_string())?;
    let mut buf = [0u8; 1024];
    let mut got = Vec::new();
    while !got
        .windows(13)
        .any(|w| w.eq_ignore_ascii_case(b"Hello, world!"))
    {
        let n = s.read(&mut buf).map_err(|e| e.to_string())?;
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&got);
    // fibra's example says "Hello, World!", the others "Hello, world!": same length.
    if text.starts_with("HTTP/1.1 200") && text.to_ascii_lowercase().contains("hello, world!") {
        Ok(())
    } else {
        Err(format!("unexpected response: {:?}", last_line(&text)))
    }
}

/// What one wrk run measured.
struct WrkRun {
    rps: f64,
    /// (percentile, ms) from the "Latency Distribution" block (`--latency`), if printed.
    latency: Vec<(f64, f64)>,
    /// Error lines wrk printed (socket errors, non-2xx responses).
    warnings: Vec<String>,
}

impl WrkRun {
    fn latency_ms(&self, pct: f64) -> Option<f64> {
        self.latency
            .iter()
            .find(|(p, _)| *p == pct)
            .map(|&(_, ms)| ms)
    }
}

/// The "Latency Distribution" block that `wrk --latency` prints, as (percentile, ms):
///
/// ```text
///   Latency Distribution
///      50%    3.92ms
///      99%  812.00us
/// ```
fn parse_latency(stdout: &str) -> Result<Vec<(f64, f64)>, String> {
    let Some(block) = stdout.split_once("Latency Distribution").map(|(_, b)| b) else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for line in block.lines().skip(1) {
        let Some((pct, value)) = line.trim().split_once('%') else {
            break;
        };
        let Ok(pct) = pct.trim().parse::<f64>() else {
            break;
        };
        let ms = duration_ms(value.trim())
            .ok_or_else(|| format!("cannot read wrk latency {:?}", line.trim()))?;
        out.push((pct, ms));
    }
    Ok(out)
}

/// A duration as wrk prints it (`812.00us`, `3.92ms`, `1.02s`, `1.50m`, `2.00h`) in ms.
fn duration_ms(s: &str) -> Option<f64> {
    const UNITS: [(&str, f64); 5] = [
        ("us", 1e-3),
        ("ms", 1.0),
        ("s", 1e3),
        ("m", 60e3),
        ("h", 3600e3),
    ];
    UNITS.iter().find_map(|&(unit, ms)| {
        let number = s.strip_suffix(unit)?;
        // "ms" and "us" also end in "s": the number must parse on its own.
        number.trim().parse::<f64>().ok().map(|v| v * ms)
    })
}

/// Runs wrk once (on `cpu` alone, if given); returns requests/s, the latency percentiles and any
/// error lines wrk printed.
fn wrk_once(wrk: &Path, args: &[&str], url: &str, cpu: Option<usize>) -> Result<WrkRun, String> {
    let mut cmd = Command::new(wrk);
    cmd.args(args).arg(url);
    if let Some(cpu) = cpu {
        pin(&mut cmd, cpu);
    }
    let out = run_limited(cmd, Duration::from_secs(30))?;
    if !out.status.success() {
        return Err(format!("wrk failed: {}", last_line(&out.stderr)));
    }
    let rps = out
        .stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("Requests/sec:"))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .ok_or_else(|| format!("no Requests/sec in wrk output: {}", last_line(&out.stdout)))?;
    let warnings = out
        .stdout
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("Socket errors") || l.starts_with("Non-2xx"))
        .map(|l| format!("wrk: {l}"))
        .collect();
    let latency = parse_latency(&out.stdout)?;
    Ok(WrkRun {
        rps,
        latency,
        warnings,
    })
}

/// Starts `cmd` with no stdin and its stdout and stderr going to the file `log`.
fn spawn_logged(cmd: &mut Command, log: &Path) -> std::io::Result<Child> {
    let f = std::fs::File::create(log)?;
    cmd.stdin(Stdio::null())
        .stdout(f.try_clone()?)
        .stderr(f)
        .spawn()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * b.abs().max(1.0)
    }

    #[test]
    fn reads_wrk_latency_units() {
        for (text, ms) in [
            ("812.00us", 0.812),
            ("3.92ms", 3.92),
            ("1.02s", 1020.0),
            ("1.50m", 90_000.0),
            ("2.00h", 7_200_000.0),
        ] {
            let got = duration_ms(text).expect(text);
            assert!(close(got, ms), "{text}: {got} ms, want {ms}");
        }
        assert_eq!(duration_ms("fast"), None);
        assert_eq!(duration_ms("12"), None);
    }

    #[test]
    fn reads_wrk_latency_block() {
        let out = "Running 5s test @ http://127.0.0.1:1/\n  1 threads and 100 connections\n\
                   \x20 Thread Stats   Avg      Stdev     Max   +/- Stdev\n\
                   \x20   Latency     4.01ms  500.00us  20.00ms   90.00%\n\
                   \x20 Latency Distribution\n\
                   \x20    50%    3.92ms\n\
                   \x20    75%    4.10ms\n\
                   \x20    90%  812.00us\n\
                   \x20    99%    1.02s \n\
                   \x20 120000 requests in 5.00s, 9.00MB read\n\
                   Requests/sec:  24000.00\n";
        let lat = parse_latency(out).expect("parses");
        let want = [(50.0, 3.92), (75.0, 4.10), (90.0, 0.812), (99.0, 1020.0)];
        assert_eq!(lat.len(), want.len(), "{lat:?}");
        for ((p, ms), (wp, wms)) in lat.iter().zip(want) {
            assert!(*p == wp && close(*ms, wms), "{lat:?}");
        }
        assert_eq!(parse_latency("Requests/sec: 1\n"), Ok(Vec::new()));
        assert!(parse_latency("  Latency Distribution\n     50%    soon\n").is_err());
    }
}
