//! The workload catalogue (the table in this crate's README), the peers, which peer runs which
//! workload (and why not, when it does not), and the in-process dispatch used by a `__run`
//! child process.
//!
//! Each workload lives in its own file with one function per peer side by side, so that the code
//! being compared can be read together. Go's versions are in `benches/compare/go/`.

pub mod async_round_trip;
pub mod block_on_ready;
pub mod broadcast;
pub mod chained_spawn;
pub mod http;
pub mod idle_cpu;
pub mod join_chain;
pub mod million_park;
pub mod mpmc;
pub mod park_memory;
pub mod ping_pong;
pub mod ping_pong_mpsc;
pub mod redis_get;
pub mod skynet;
pub mod sleep_storm;
pub mod spawn_join;
pub mod spawn_many;
pub mod spawn_remote;
pub mod timer_lateness;
pub mod unblock;
pub mod unblock_seq;
pub mod yield_many;

use std::time::Duration;

/// A runtime compared against fibra.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peer {
    Fibra,
    /// fibra's own `fibra::net` server (`examples/http_hello`), as the peer of the `hook`
    /// feature's std server in `http_hooked`; it runs no other workload (see [`applies`]).
    FibraNet,
    Tokio,
    May,
    Go,
    Std,
}

impl Peer {
    /// All peers, in table order (fibra first).
    pub const ALL: [Peer; 6] = [
        Peer::Fibra,
        Peer::FibraNet,
        Peer::Tokio,
        Peer::May,
        Peer::Go,
        Peer::Std,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Peer::Fibra => "fibra",
            Peer::FibraNet => "fibra-net",
            Peer::Tokio => "tokio",
            Peer::May => "may",
            Peer::Go => "go",
            Peer::Std => "std",
        }
    }

    pub fn parse(s: &str) -> Option<Peer> {
        Peer::ALL.into_iter().find(|p| p.name() == s)
    }
}

/// How a workload is run by the parent process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// A child process per peer and round (see `driver::run_workload`): one warm-up, then
    /// that round's repetitions on one runtime.
    Timed,
    /// One fresh child process per repetition, no warm-up (memory and CPU figures must not see
    /// what an earlier repetition left behind).
    FreshPerRep,
    /// A server child per peer, loaded by `wrk` from the parent.
    Http,
    /// Like `Timed`, against a `redis-server` that the parent starts once for the workload.
    Redis,
    /// No runs of its own: the figures come from the runs of the workload named in
    /// [`Workload::of`], which report them alongside their own (wrk's latency percentiles
    /// next to its requests/s, million_park's wake-up time next to its spawn time).
    Derived,
}

/// How many worker threads a workload's runtimes get.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Threads {
    /// The run's `--threads` (GOMAXPROCS for Go).
    Run,
    /// One, whatever `--threads` says: the single-worker variant of a workload.
    One,
}

/// One row of the workload table.
#[derive(Debug)]
pub struct Workload {
    pub name: &'static str,
    pub unit: &'static str,
    /// `true` for times, CPU and memory; `false` for throughput (http, http_cont,
    /// http_hooked).
    pub lower_is_better: bool,
    pub mode: Mode,
    /// Wall-clock limit for one child process; past it the child is killed and the peer is
    /// reported as failed (a hang becomes a finding, not a stuck run). Unused for derived rows.
    pub limit: Duration,
    /// Worker threads of every peer's runtime for this row (std's threads are per task).
    pub threads: Threads,
    /// The workload this row belongs to. A [`Mode::Derived`] row takes its figures from that
    /// workload's runs; any other row with `of` set is a variant of it (same program, another
    /// thread count): its children run that workload. `--only <of>` selects the row too.
    pub of: Option<&'static str>,
    /// Server rows only: the load generator runs on one CPU and the server on another (the
    /// first two this process may use), so neither takes the other's CPU, and the row shows
    /// the runtime alone rather than how it shares a CPU with `wrk`.
    pub pinned: bool,
}

impl Workload {
    /// The workload a child process runs for this row (the Go program's `-w`, `__run`'s).
    pub fn program(&self) -> &'static str {
        self.of.unwrap_or(self.name)
    }

    /// The workloads the run needs for `--only <names>`: every named row, the rows that
    /// belong to a named one (its variants and derived rows), and the row whose runs a named
    /// derived row takes its figures from.
    pub fn selected(&self, names: &[String]) -> bool {
        names.iter().any(|n| {
            n == self.name
                || self.of == Some(n.as_str())
                || find(n).is_some_and(|w| w.mode == Mode::Derived && w.of == Some(self.name))
        })
    }
}

pub const WORKLOADS: &[Workload] = &[
    timed("spawn_many", "ns/task", 60),
    timed("spawn_remote", "ns/task", 60),
    timed("spawn_join", "ns/round trip", 60),
    timed("yield_many", "ns/yield", 60),
    timed("ping_pong", "ns/round trip", 60),
    timed("ping_pong_mpsc", "ns/round trip", 60),
    timed("chained_spawn", "ns/hop", 60),
    timed("join_chain", "ns/hop", 60),
    Workload {
        threads: Threads::One,
        of: Some("join_chain"),
        ..timed("join_chain_1w", "ns/hop, 1 worker", 60)
    },
    Workload {
        mode: Mode::FreshPerRep,
        of: Some("join_chain"),
        ..timed("join_chain_cold", "ns/hop, cold", 60)
    },
    timed("skynet", "ms", 60),
    timed("sleep_storm", "ms over 50", 60),
    timed("timer_p50", "µs late", 60),
    timed("timer_p99", "µs late", 60),
    timed("unblock", "ns/call", 60),
    timed("unblock_seq", "ns/call", 60),
    timed("mpmc", "ns/message", 60),
    timed("broadcast", "ns/message", 60),
    timed("block_on_ready", "ns/call", 60),
    timed("async_round_trip", "ns/round trip", 60),
    Workload {
        name: "idle_cpu",
        unit: "CPU ms in 2 s",
        lower_is_better: true,
        mode: Mode::FreshPerRep,
        limit: Duration::from_secs(15),
        threads: Threads::Run,
        of: None,
        pinned: false,
    },
    Workload {
        name: "park_memory",
        unit: "KiB/fiber",
        lower_is_better: true,
        mode: Mode::FreshPerRep,
        limit: Duration::from_secs(30),
        threads: Threads::Run,
        of: None,
        pinned: false,
    },
    Workload {
        name: "million_park",
        unit: "µs/fiber",
        lower_is_better: true,
        mode: Mode::FreshPerRep,
        limit: Duration::from_secs(180),
        threads: Threads::Run,
        of: None,
        pinned: false,
    },
    derived("million_wake", "µs/fiber", "million_park"),
    http_server("http"),
    derived("http_p50", "ms", "http"),
    derived("http_p99", "ms", "http"),
    Workload {
        threads: Threads::One,
        pinned: true,
        ..http_server("http_pinned")
    },
    derived("http_pinned_p50", "ms", "http_pinned"),
    derived("http_pinned_p99", "ms", "http_pinned"),
    http_server("http_cont"),
    derived("http_cont_p50", "ms", "http_cont"),
    derived("http_cont_p99", "ms", "http_cont"),
    http_server("http_hooked"),
    derived("http_hooked_p50", "ms", "http_hooked"),
    derived("http_hooked_p99", "ms", "http_hooked"),
    Workload {
        name: "redis_get",
        unit: "ns/GET",
        lower_is_better: true,
        mode: Mode::Redis,
        limit: Duration::from_secs(60),
        threads: Threads::Run,
        of: None,
        pinned: false,
    },
];

const fn timed(name: &'static str, unit: &'static str, limit_s: u64) -> Workload {
    Workload {
        name,
        unit,
        lower_is_better: true,
        mode: Mode::Timed,
        limit: Duration::from_secs(limit_s),
        threads: Threads::Run,
        of: None,
        pinned: false,
    }
}

/// A workload of `wrk` against each peer's HTTP server (requests/s, higher is better).
const fn http_server(name: &'static str) -> Workload {
    Workload {
        name,
        unit: "req/s",
        lower_is_better: false,
        mode: Mode::Http,
        limit: Duration::from_secs(30),
        threads: Threads::Run,
        of: None,
        pinned: false,
    }
}

/// A row whose figures (lower is better) the runs of workload `of` report.
const fn derived(name: &'static str, unit: &'static str, of: &'static str) -> Workload {
    Workload {
        name,
        unit,
        lower_is_better: true,
        mode: Mode::Derived,
        limit: Duration::ZERO,
        threads: Threads::Run,
        of: Some(of),
        pinned: false,
    }
}

pub fn find(name: &str) -> Option<&'static Workload> {
    WORKLOADS.iter().find(|w| w.name == name)
}

/// Whether `peer` has a cell in `workload`'s row at all. Only `fibra-net` is limited: it is a
/// second fibra server for `http_hooked`, not a runtime to compare on every workload, so it
/// shows up nowhere else (not even as skipped).
pub fn applies(peer: Peer, workload: &str) -> bool {
    peer != Peer::FibraNet || family(workload) == "http_hooked"
}

/// The workload whose program runs for row `workload` (itself, or the row it belongs to):
/// skip reasons and notes are keyed by it, so a variant or derived row shares them.
pub fn family(workload: &str) -> &str {
    find(workload).map_or(workload, |w| w.program())
}

/// An example program of the workspace that the parent builds (`cargo build --release -p
/// <package> --example <name> --features <features>`) and runs as a peer's child process.
#[derive(Clone, Copy, Debug)]
pub struct Example {
    /// The package whose `examples/` holds it: `fibra`, or `fibra-interop` for the programs
    /// that need crates fibra's own build leaves out (the `redis` client).
    pub package: &'static str,
    pub name: &'static str,
    pub features: &'static [&'static str],
}

/// The program that stands for `peer` on `workload` when it is one of fibra's examples rather
/// than this binary: the http servers, and the hooked redis client, which must not share a
/// process with the other peers (the `hook` feature would reroute tokio's system calls too).
pub fn fibra_example(peer: Peer, workload: &str) -> Option<Example> {
    const PLAIN: &[&str] = &[];
    const HOOK: &[&str] = &["hook"];
    let (package, name, features) = match (peer, workload) {
        (Peer::Fibra, "http" | "http_pinned") | (Peer::FibraNet, "http_hooked") => {
            ("fibra", "http_hello", PLAIN)
        }
        (Peer::Fibra, "http_cont") => ("fibra", "http_cont", PLAIN),
        (Peer::Fibra, "http_hooked") => ("fibra", "http_std", HOOK),
        (Peer::Fibra, "redis_get") => ("fibra-interop", "redis_load", HOOK),
        _ => return None,
    };
    Some(Example {
        package,
        name,
        features,
    })
}

/// Why `peer` does not run `workload`, when that is decided by design rather than by what is
/// installed on the machine (Go and wrk availability is checked by the parent).
pub fn skip_reason(peer: Peer, workload: &str) -> Option<&'static str> {
    if peer == Peer::May && find(workload).is_some_and(|w| w.pinned) {
        return Some("may pins its workers to cores itself, which would undo the row's pinning");
    }
    match (peer, family(workload)) {
        (Peer::Std, "yield_many") => {
            Some("thread::yield_now is only a hint to the OS scheduler: no like-for-like meaning")
        }
        (Peer::Std, "skynet") => Some("1 111 111 OS threads: not a thread workload"),
        (Peer::Std, "sleep_storm" | "timer_p50" | "timer_p99") => {
            Some("10 000 sleeping OS threads: not a thread workload")
        }
        (Peer::Std, "idle_cpu") => Some("plain threads have no runtime that could idle"),
        (Peer::Std, "park_memory") => Some("100 000 parked OS threads: not a thread workload"),
        (Peer::Std, "million_park") => Some("1 000 000 parked OS threads: not a thread workload"),
        (Peer::Std, "join_chain") => Some(
            "2 000 OS threads alive at once, each blocked joining the next: not a thread workload",
        ),
        (Peer::May | Peer::Std, "unblock" | "unblock_seq") => {
            Some("no blocking pool: tokio's spawn_blocking is the peer for fibra::unblock")
        }
        (Peer::Std, "http" | "http_pinned") => {
            Some("thread-per-connection server is not part of this comparison")
        }
        (Peer::May | Peer::Std, "http_cont") => Some(
            "http_cont compares fibra's continuation server with tokio and Go; this peer's \
             server is in the http row",
        ),
        (Peer::May | Peer::Go | Peer::Std, "http_hooked") => Some(
            "http_hooked compares fibra's two servers and tokio; this peer's is in the http row",
        ),
        (Peer::May | Peer::Go | Peer::Std, "redis_get") => Some(
            "redis_get compares the blocking redis client in fibers with the async one on tokio",
        ),
        (Peer::May, "mpmc") => Some("may's mpmc channel is unbounded only: no bounded(128) peer"),
        (Peer::May | Peer::Std, "broadcast") => Some("no broadcast channel"),
        (Peer::May | Peer::Go | Peer::Std, "block_on_ready") => {
            Some("no async runtime: block_on_ready compares fibra::future::block_on with tokio's")
        }
        (Peer::May | Peer::Go | Peer::Std, "async_round_trip") => Some(
            "no async runtime: async_round_trip compares a fiber's round trip to a tokio task \
             with a tokio task's",
        ),
        _ => None,
    }
}

/// How `peer`'s figure for `workload` is obtained, where that differs from the other peers.
pub fn note(peer: Peer, workload: &str) -> Option<&'static str> {
    match (peer, family(workload)) {
        (Peer::Go, "spawn_join") => Some(
            "go: from the main goroutine (Go has no plain threads); the goroutine signals a \
             channel of capacity 1",
        ),
        (Peer::Go, "spawn_remote") => {
            Some("go: submitted from the main goroutine (Go has no plain threads), WaitGroup join")
        }
        (Peer::Go, "ping_pong") => Some("go: channels of capacity 1 as oneshots"),
        (Peer::Go, "ping_pong_mpsc") => Some(
            "go: channels of capacity 1 (one message is ever in flight on each)",
        ),
        (Peer::Go, "join_chain") => Some(
            "go: each goroutine waits for the next one's result on a channel of capacity 1 \
             (goroutines have no join handle)",
        ),
        (Peer::Fibra, "million_park") => Some(
            "fibra: default 256 KiB stacks; fibers block in recv on clones of one \
             fibra::sync::mpmc receiver, woken by dropping the sender",
        ),
        (Peer::Tokio, "million_park") => Some(
            "tokio: tasks await changed() on clones of one tokio::sync::watch receiver, woken by \
             one send",
        ),
        (Peer::May, "million_park") => {
            Some("may: coroutines wait on one may::sync::SyncFlag, woken by fire()")
        }
        (Peer::Go, "million_park") => Some(
            "go: goroutines block receiving from one channel, woken by closing it; WaitGroup join",
        ),
        (Peer::Fibra, "http" | "http_pinned") => Some(
            "fibra: examples/http_hello (httparse; connections dealt to workers in turn), \
             built by the harness",
        ),
        (Peer::Fibra, "http_cont") => Some(
            "fibra: examples/http_cont (http_hello's framing; between requests a connection is a \
             readiness continuation, TcpListener::serve/TcpStream::serve, and each request a new task \
             on any worker), built by the harness",
        ),
        (Peer::Fibra, "http_hooked") => Some(
            "fibra: examples/http_std (std::net::TcpListener/TcpStream, blocking calls parked by \
             the hook feature; same framing as http_hello), built by the harness with --features hook",
        ),
        (Peer::FibraNet, "http_hooked") => Some(
            "fibra-net: examples/http_hello (fibra::net), the server of fibra's http cell; \
             fibra/fibra-net is the hooks' cost",
        ),
        (Peer::Fibra, "redis_get") => Some(
            "fibra: tests/interop/examples/redis_load (the synchronous redis crate in fibers, hook feature), \
             built by the harness with --features hook",
        ),
        (Peer::Tokio, "redis_get") => Some(
            "tokio: the redis crate's async MultiplexedConnection, one per task, response \
             timeout off (the blocking client has none)",
        ),
        (Peer::Go, "http" | "http_cont" | "http_pinned") => {
            Some("go: net/http (a full HTTP stack; the Rust servers frame requests minimally)")
        }
        (Peer::Tokio, "mpmc") => Some("tokio: async-channel's bounded channel (tokio has no mpmc)"),
        (Peer::Std, "mpmc") => Some(
            "std: crossbeam-channel's bounded channel, one OS thread per producer and consumer; \
             --threads does not apply",
        ),
        (Peer::Fibra, "block_on_ready") => Some(
            "fibra: fibra::future::block_on in a fiber; the scheduler has a tokio runtime \
             (tokio_handle), whose context each poll enters",
        ),
        (Peer::Tokio, "block_on_ready") => Some(
            "tokio: Runtime::block_on from a plain thread (not allowed on the runtime's workers)",
        ),
        (Peer::Fibra, "async_round_trip") => Some(
            "fibra: 2N threads: the client fiber on a fibra scheduler with N workers, the echo \
             task on a tokio runtime with N workers",
        ),
        (Peer::Tokio, "async_round_trip") => {
            Some("tokio: N threads: client and echo tasks on one runtime with N workers")
        }
        (Peer::Std, _) => Some("std: one OS thread per task; --threads does not apply"),
        _ => None,
    }
}

/// Parameters of one child run.
#[derive(Clone, Copy, Debug)]
pub struct Cfg {
    pub threads: usize,
    pub reps: usize,
    pub warmup: bool,
    /// The loopback port of the server the workload talks to (`redis_get`), if any.
    pub port: Option<u16>,
}

/// One repetition's figures: the workload's own, and those of the rows derived from it
/// ([`Mode::Derived`], by row name).
#[derive(Clone, Debug)]
pub struct Figures {
    pub value: f64,
    pub also: Vec<(&'static str, f64)>,
}

impl From<f64> for Figures {
    fn from(value: f64) -> Figures {
        Figures {
            value,
            also: Vec::new(),
        }
    }
}

/// Runs `workload` for `peer` inside this process and returns the figures of each repetition.
/// Go is never run in-process (its programs are separate binaries), `http` and `http_hooked` are
/// driven by the parent through [`http::serve`], and fibra's side of those and of `redis_get`
/// is one of the crate's examples ([`fibra_example`]).
pub fn run(peer: Peer, workload: &str, cfg: Cfg) -> Result<Vec<Figures>, String> {
    if let Some(reason) = skip_reason(peer, workload) {
        return Err(reason.to_string());
    }
    if peer == Peer::FibraNet {
        return Err(format!("fibra-net does not run {workload}"));
    }
    if workload == "million_park" {
        return million_park::run(peer, cfg);
    }
    let f = match workload {
        "spawn_many" => spawn_many::run,
        "spawn_remote" => spawn_remote::run,
        "spawn_join" => spawn_join::run,
        "yield_many" => yield_many::run,
        "ping_pong" => ping_pong::run,
        "ping_pong_mpsc" => ping_pong_mpsc::run,
        "chained_spawn" => chained_spawn::run,
        "join_chain" => join_chain::run,
        "skynet" => skynet::run,
        "sleep_storm" => sleep_storm::run,
        "timer_p50" => |p, c| timer_lateness::run(p, c, timer_lateness::Pct::P50),
        "timer_p99" => |p, c| timer_lateness::run(p, c, timer_lateness::Pct::P99),
        "unblock" => unblock::run,
        "unblock_seq" => unblock_seq::run,
        "mpmc" => mpmc::run,
        "broadcast" => broadcast::run,
        "block_on_ready" => block_on_ready::run,
        "async_round_trip" => async_round_trip::run,
        "idle_cpu" => idle_cpu::run,
        "park_memory" => park_memory::run,
        "redis_get" => redis_get::run,
        other => return Err(format!("workload {other} cannot run in-process")),
    };
    f(peer, cfg).map(|v| v.into_iter().map(Figures::from).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_that_belong_to_a_workload_follow_it() {
        for (i, w) in WORKLOADS.iter().enumerate() {
            assert_eq!(find(w.name).map(|f| f.name), Some(w.name), "unique names");
            let Some(of) = w.of else { continue };
            let parent = WORKLOADS[..i].iter().find(|p| p.name == of);
            let parent = parent.unwrap_or_else(|| panic!("{}: {of} must come first", w.name));
            assert!(
                parent.of.is_none(),
                "{}: {of} belongs to no other row",
                w.name
            );
            assert_ne!(parent.mode, Mode::Derived);
        }
    }

    #[test]
    fn only_selects_what_a_row_needs() {
        let names = |list: &[&str]| -> Vec<&str> {
            let only: Vec<String> = list.iter().map(|s| s.to_string()).collect();
            WORKLOADS
                .iter()
                .filter(|w| w.selected(&only))
                .map(|w| w.name)
                .collect()
        };
        assert_eq!(
            names(&["join_chain", "million_park"]),
            [
                "join_chain",
                "join_chain_1w",
                "join_chain_cold",
                "million_park",
                "million_wake"
            ]
        );
        assert_eq!(names(&["join_chain_1w"]), ["join_chain_1w"]);
        assert_eq!(
            names(&["join_chain"]),
            ["join_chain", "join_chain_1w", "join_chain_cold"]
        );
        assert_eq!(names(&["million_wake"]), ["million_park", "million_wake"]);
        assert_eq!(names(&["http"]), ["http", "http_p50", "http_p99"]);
        assert_eq!(
            names(&["http_pinned_p99"]),
            ["http_pinned", "http_pinned_p99"]
        );
        assert_eq!(names(&["http_cont_p99"]), ["http_cont", "http_cont_p99"]);
        assert_eq!(
            names(&["http_hooked_p99"]),
            ["http_hooked", "http_hooked_p99"]
        );
    }

    #[test]
    fn variants_share_skip_reasons_and_fibra_net_only_sees_http_hooked() {
        assert_eq!(family("join_chain_1w"), "join_chain");
        assert_eq!(family("million_wake"), "million_park");
        assert_eq!(family("http_p99"), "http");
        assert_eq!(family("http_pinned_p99"), "http_pinned");
        assert!(skip_reason(Peer::May, "http_pinned").is_some());
        assert!(skip_reason(Peer::May, "http").is_none());
        assert!(skip_reason(Peer::Std, "join_chain_1w").is_some());
        assert!(skip_reason(Peer::Std, "million_wake").is_some());
        assert!(applies(Peer::FibraNet, "http_hooked"));
        assert!(applies(Peer::FibraNet, "http_hooked_p99"));
        assert!(!applies(Peer::FibraNet, "join_chain_1w"));
        assert!(!applies(Peer::FibraNet, "http_p99"));
    }
}
