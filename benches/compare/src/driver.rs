//! The parent side: runs every (workload, peer) in a child process with a time limit (re-exec of
//! this binary with the hidden `__run`/`__serve` subcommands, the Go program, or one of the
//! fibra crate's examples), builds the Go program and those examples, drives `wrk` for the http
//! workloads, starts `redis-server` for redis_get, and collects one [`PeerRun`] per cell of the
//! table.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::workloads::{self, Example, Mode, Peer, Workload};

/// What happened to one peer on one workload.
#[derive(Clone, Debug)]
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
}

impl PeerRun {
    fn skipped(peer: Peer, why: impl Into<String>) -> PeerRun {
        PeerRun {
            peer,
            status: Status::Skipped(why.into()),
            samples: Vec::new(),
            notes: Vec::new(),
        }
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

/// What the parent starts once per workload, before its peers run, and stops after them: the
/// `redis-server` of redis_get. Dropping it stops it.
pub struct Fixture {
    /// The redis-server's port, or the status every peer gets instead (skipped when
    /// redis-server is not installed, failed when it did not start).
    redis: Option<Result<RedisServer, Status>>,
}

impl Fixture {
    /// Starts what `w` needs (nothing for most workloads).
    pub fn start(env: &Env, w: &Workload) -> Fixture {
        let redis = (w.mode == Mode::Redis).then(|| match &env.redis_server {
            Ok(bin) => RedisServer::start(bin, &env.scratch).map_err(Status::Failed),
            Err(why) => Err(Status::Skipped(why.clone())),
        });
        Fixture { redis }
    }

    fn redis_port(&self) -> Result<u16, Status> {
        match &self.redis {
            Some(Ok(server)) => Ok(server.port),
            Some(Err(status)) => Err(status.clone()),
            None => Err(Status::Failed("no redis-server was started".into())),
        }
    }
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
        let child = std::fs::File::create(&log)
            .and_then(|f| {
                cmd.stdin(Stdio::null())
                    .stdout(f.try_clone()?)
                    .stderr(f)
                    .spawn()
            })
            .map_err(|e| format!("cannot start redis-server: {e}"))?;
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

/// Runs `workload` for `peer` as configured and returns the cell.
pub fn run(env: &Env, w: &Workload, peer: Peer, fixture: &Fixture) -> PeerRun {
    if let Some(why) = workloads::skip_reason(peer, w.name) {
        return PeerRun::skipped(peer, why);
    }
    if peer == Peer::Go {
        if let Err(why) = &env.go {
            return PeerRun::skipped(peer, why.clone());
        }
    }
    let mut run = match w.mode {
        Mode::Timed => collect(
            peer,
            std::iter::once(child_run(env, w, peer, env.reps, true, None)),
        ),
        Mode::FreshPerRep => collect(
            peer,
            (0..env.reps).map(|_| child_run(env, w, peer, 1, false, None)),
        ),
        Mode::Http => match &env.wrk {
            Ok(wrk) => http(env, w, peer, wrk),
            Err(why) => PeerRun::skipped(peer, why.clone()),
        },
        Mode::Redis => match fixture.redis_port() {
            Ok(port) => collect(
                peer,
                std::iter::once(child_run(env, w, peer, env.reps, true, Some(port))),
            ),
            Err(status) => PeerRun {
                peer,
                status,
                samples: Vec::new(),
                notes: Vec::new(),
            },
        },
    };
    if let Some(note) = workloads::note(peer, w.name) {
        run.notes.insert(0, note.to_string());
    }
    run
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
        cmd.args(["-w", w.name, "-reps", &reps.to_string()])
            .arg(format!("-warmup={warmup}"))
            .env("GOMAXPROCS", env.threads.to_string());
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
        cmd.args(["__run", peer.name(), w.name]);
    }
    cmd.args(["--threads", &env.threads.to_string()])
        .args(["--reps", &reps.to_string()]);
    if !warmup {
        cmd.arg("--no-warmup");
    }
    if let Some(port) = port {
        cmd.args(["--port", &port.to_string()]);
    }
    Ok(cmd)
}

/// Result of one child: its figures, or skipped/failed with a reason.
type ChildResult = Result<Vec<f64>, Status>;

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
    let mut values = Vec::new();
    for line in out.stdout.lines() {
        if let Some(v) = line.strip_prefix("value ") {
            values.push(
                v.trim()
                    .parse::<f64>()
                    .map_err(|e| Status::Failed(format!("bad figure {v:?} from child: {e}")))?,
            );
        } else if let Some(why) = line.strip_prefix("skip ") {
            return Err(Status::Skipped(why.to_string()));
        }
    }
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
    Ok(values)
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

/// Folds the results of one or more children into a cell (the first failure wins).
fn collect(peer: Peer, results: impl Iterator<Item = ChildResult>) -> PeerRun {
    let mut run = PeerRun {
        peer,
        status: Status::Ok,
        samples: Vec::new(),
        notes: Vec::new(),
    };
    for r in results {
        match r {
            Ok(v) => run.samples.extend(v),
            Err(status) => {
                run.status = status;
                break;
            }
        }
    }
    run
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
/// wrk's own duration per repetition, as BENCH.md specifies.
const WRK_ARGS: [&str; 3] = ["-t1", "-c100", "-d5s"];

/// Starts `peer`'s server for `w`, checks one response by hand, warms up for 1 s, then runs
/// `wrk` `env.reps` times and stops the server.
fn http(env: &Env, w: &Workload, peer: Peer, wrk: &Path) -> PeerRun {
    let mut run = PeerRun {
        peer,
        status: Status::Ok,
        samples: Vec::new(),
        notes: Vec::new(),
    };
    let port = match free_port() {
        Ok(p) => p,
        Err(e) => return PeerRun::skipped(peer, format!("no free port: {e}")),
    };
    let log = env.scratch.join(format!("{}-{}.log", w.name, peer.name()));
    let mut cmd = if let Some(example) = workloads::fibra_example(peer, w.name) {
        let bin = match build_example(&env.self_exe, example) {
            Ok(bin) => bin,
            Err(e) => {
                run.status = Status::Failed(e);
                return run;
            }
        };
        let mut c = Command::new(bin);
        c.args(["--port", &port.to_string()])
            .args(["--threads", &env.threads.to_string()]);
        c
    } else if peer == Peer::Go {
        let mut c = Command::new(env.go.as_ref().expect("checked by caller"));
        c.args(["-w", "http", "-port", &port.to_string()])
            .env("GOMAXPROCS", env.threads.to_string());
        c
    } else {
        let mut c = Command::new(&env.self_exe);
        c.args(["__serve", peer.name(), "--port", &port.to_string()])
            .args(["--threads", &env.threads.to_string()]);
        c
    };
    let server = std::fs::File::create(&log).and_then(|f| {
        cmd.stdin(Stdio::null())
            .stdout(f.try_clone()?)
            .stderr(f)
            .spawn()
    });
    let mut server = match server {
        Ok(s) => s,
        Err(e) => {
            run.status = Status::Failed(format!("cannot start server: {e}"));
            return run;
        }
    };
    let url = format!("http://127.0.0.1:{port}/");
    let result = (|| -> Result<(), String> {
        wait_ready(&mut server, port, &log)?;
        wrk_once(wrk, &["-t1", "-c100", "-d1s"], &url)?;
        for _ in 0..env.reps {
            let (rps, warnings) = wrk_once(wrk, &WRK_ARGS, &url)?;
            run.samples.push(rps);
            run.notes.extend(warnings);
        }
        Ok(())
    })();
    kill(&mut server);
    if let Err(e) = result {
        run.status = Status::Failed(e);
    }
    run.notes.dedup();
    run
}

/// Builds one of the fibra crate's examples with its features and this binary's profile (so
/// into the same target directory) and returns its path. Cargo keeps the fibra library built
/// with and without `hook` side by side, so switching between them costs no rebuild.
fn build_example(self_exe: &Path, example: Example) -> Result<PathBuf, String> {
    let name = example.name;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "--quiet", "-p", "fibra", "--example", name])
        .current_dir(root);
    if !example.features.is_empty() {
        cmd.args(["--features", &example.features.join(",")]);
    }
    if !cfg!(debug_assertions) {
        cmd.arg("--release");
    }
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run cargo to build examples/{name}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "cargo build --example {name} failed: {}",
            last_line(&String::from_utf8_lossy(&out.stderr))
        ));
    }
    let bin = self_exe
        .parent()
        .map(|dir| dir.join("examples").join(name))
        .filter(|p| p.is_file())
        .ok_or_else(|| format!("built examples/{name} but cannot find it next to this binary"))?;
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

/// Runs wrk once; returns requests/s and any error lines wrk printed.
fn wrk_once(wrk: &Path, args: &[&str], url: &str) -> Result<(f64, Vec<String>), String> {
    let mut cmd = Command::new(wrk);
    cmd.args(args).arg(url);
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
    Ok((rps, warnings))
}
