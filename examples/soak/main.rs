//! A seeded soak test of the whole public surface: randomized operations from fibers and
//! threads, for a given time, with every task, message and byte accounted for.
//!
//! ```text
//! cargo run --example soak -- [--seconds 60] [--seed S] [--threads 3] [--actors 2]
//!                             [--round-secs 10] [--warmup-secs 2] [--hang-secs 30]
//!                             [--rss-slack-mib 8+4*threads] [--heap-slack-mib 8]
//! ```
//!
//! The seed (by default taken from the clock) is printed first and again with any failure:
//! `--seed S` replays the same choice of operations (the interleaving is the OS's). Each
//! actor (a fiber or a thread) and each task that makes choices draws from a SplitMix64
//! stream of its own, derived from the seed.
//!
//! The run is a warm-up round, then rounds of `--round-secs` until `--seconds` have passed.
//! In a round, `--actors` fibers per area, and as many plain threads, pick operations at
//! random: tasks (spawn and join from fibers and threads, pinned submits, cancel, yield,
//! sleep, park/unpark, panics by design, `JoinSet`, `scope`, `spawn_local`, fiber-locals,
//! continuations, `block_on`, futures), `sync` (locks, condition variables, semaphores,
//! barriers, wait groups, `OnceLock`, cancellation tokens), channels (mpsc, mpmc, oneshot
//! and broadcast, receivers dropped at random, `select!`, `Select` and `SelectArms` with
//! timeouts), the network (loopback TCP echo, connections closed mid-stream by either side,
//! `sync::Pool`) and the rest (`unblock`, `time::Timer`, a second scheduler started and
//! stopped). After each round the soak waits for quiescence and checks that
//! - every task it submitted is accounted for (completed, cancelled, or panicked by design),
//!   its handle agreeing with its own record, and the scheduler's metrics (`spawned`, tasks
//!   finished per worker, live tasks) agree with the soak's counts;
//! - every message made was received, given back by a failed send, or dropped with its
//!   receiver (sent = received + dropped); broadcast deliveries were received, lagged over
//!   or dropped with their receiver; echoed bytes matched;
//! - open fds and threads are back to the baseline taken after the warm-up round, and
//!   resident memory and the live heap within `--rss-slack-mib` and `--heap-slack-mib` of
//!   it (see `RSS_SLACK_MIB`, `RSS_SLACK_PER_WORKER_MIB` and `HEAP_SLACK_MIB`).
//!
//! Inequalities between the counters are also checked every 100 ms while the actors run. A
//! watcher thread that sees no progress for `--hang-secs` prints every live scheduler's
//! `dump()` and exits with status 3 (unless the kernel kept the soak's threads off the CPU
//! meanwhile: starvation on a busy machine is reported, not taken for a hang). The run ends
//! with a summary; the exit status is 0 only if every check held.

#[macro_use]
mod acct;
mod chans;
mod hook;
mod misc;
mod net;
mod res;
mod rng;
mod syncs;
mod tasks;
mod watch;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use acct::{did, fail, wrap, Op, SchedCounts, Ticket, Tracked, ACCT};
use fibra::Scheduler;
use res::Resources;
use rng::Rng;

/// Counts the live heap, for the figures at quiescence.
#[global_allocator]
static ALLOCATOR: res::Counting = res::Counting;

/// The main scheduler's name; its worker threads are `soak-0`, `soak-1`, …
const MAIN_NAME: &str = "soak";

/// How far above the baseline resident memory may be after a round, by default: this many
/// MiB, plus [`RSS_SLACK_PER_WORKER_MIB`] per worker of the main scheduler.
///
/// Measured after `malloc_trim` at quiescence, RSS still holds what no leak explains: pages
/// touched for the first time late in a run — the binary's code (a debug build's text is
/// several MiB), and the fiber stacks each worker caches for reuse (up to
/// `DEFAULT_STACK_CACHE`, 256, per worker; a cached stack keeps every page a fiber on it
/// ever touched) — the task cells the scheduler keeps for reuse (docs/design.md, "Task
/// memory"), glibc's per-thread arenas (the blocking pool's, the second schedulers' and the
/// timers' threads come and go), and the high-water marks of channel and queue buffers. On
/// the 2-core machine the soak was written on (debug build) RSS grew over the baseline by at
/// most 2.6 MiB in 48 runs of 21 to 58 s with 1 to 4 workers, by 2.9 and 3.7 MiB in two
/// runs of 10 minutes with 3 (most of it in the first minute, then about 0.1 MiB a minute),
/// and in 60 s by 5.0 MiB with 8 workers and 8.6 MiB with 16: the default slack (20 MiB with
/// the default 3 workers, 72 MiB with 16) is five times the most seen or more. Those runs
/// made 3 900 to 15 300 operations a second: a leak of 100 bytes per operation crosses the
/// default slack within a minute.
pub const RSS_SLACK_MIB: u64 = 8;

/// The part of the default RSS slack that grows with the workers (see [`RSS_SLACK_MIB`]).
pub const RSS_SLACK_PER_WORKER_MIB: u64 = 4;

/// How far above the baseline the live heap ([`res::Counting`]) may be after a round, in
/// MiB, by default. The heap holds the task cells fibra keeps for reuse, up to 4 MiB per size
/// class in its shared depot (docs/design.md, "Task memory"); in the runs above it grew by at
/// most 0.13 MiB in the short runs, 0.22 MiB in 10 minutes and 0.68 MiB in 60 s with 16
/// workers. The slack is two depots' worth.
pub const HEAP_SLACK_MIB: u64 = 8;

/// The command line.
#[derive(Clone, Debug)]
pub struct Options {
    pub seconds: u64,
    pub seed: u64,
    pub threads: usize,
    pub actors: u64,
    pub round: Duration,
    pub warmup: Duration,
    pub hang: Duration,
    /// `None`: the default, which depends on the workers (see [`Options::rss_slack_mib`]).
    pub rss_slack: Option<u64>,
    pub heap_slack_mib: u64,
}

impl Options {
    fn parse() -> Options {
        let mut o = Options::with_seed(clock_seed());
        let mut args = std::env::args().skip(1);
        while let Some(a) = args.next() {
            let mut value = |what: &str| -> u64 {
                args.next()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or_else(|| usage(&format!("{a} needs {what}")))
            };
            match a.as_str() {
                "--seconds" => o.seconds = value("a number of seconds"),
                "--seed" => o.seed = value("a number"),
                "--threads" => o.threads = value("a number of workers").max(1) as usize,
                "--actors" => o.actors = value("a number of actors").max(1),
                "--round-secs" => o.round = Duration::from_secs(value("seconds").max(1)),
                "--warmup-secs" => o.warmup = Duration::from_secs(value("seconds").max(1)),
                "--hang-secs" => o.hang = Duration::from_secs(value("seconds").max(1)),
                "--rss-slack-mib" => o.rss_slack = Some(value("MiB")),
                "--heap-slack-mib" => o.heap_slack_mib = value("MiB"),
                "-h" | "--help" => usage(""),
                other => usage(&format!("unknown argument {other}")),
            }
        }
        o
    }

    /// The defaults, with `seed`.
    pub fn with_seed(seed: u64) -> Options {
        Options {
            seconds: 60,
            seed,
            threads: 3,
            actors: 2,
            round: Duration::from_secs(10),
            warmup: Duration::from_secs(2),
            hang: Duration::from_secs(30),
            rss_slack: None,
            heap_slack_mib: HEAP_SLACK_MIB,
        }
    }
}

impl Options {
    /// The RSS slack in MiB: as given, or the default for the workers.
    pub fn rss_slack_mib(&self) -> u64 {
        self.rss_slack
            .unwrap_or(RSS_SLACK_MIB + RSS_SLACK_PER_WORKER_MIB * self.threads as u64)
    }
}

fn usage(why: &str) -> ! {
    if !why.is_empty() {
        eprintln!("soak: {why}");
    }
    eprintln!(
        "usage: soak [--seconds N] [--seed S] [--threads N] [--actors N] [--round-secs N] \
         [--warmup-secs N] [--hang-secs N] [--rss-slack-mib N] [--heap-slack-mib N]"
    );
    std::process::exit(2)
}

/// A seed from the clock (nanoseconds since the epoch, mixed with the process id).
fn clock_seed() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    t ^ (u64::from(std::process::id()) << 32)
}

fn main() {
    let opts = Options::parse();
    let ok = run(&opts);
    std::process::exit(if ok { 0 } else { 1 });
}

// ---- the schedulers the hang detector dumps ----

static SCHEDULERS: Mutex<Vec<std::sync::Weak<Scheduler>>> = Mutex::new(Vec::new());

/// Lists `s` for the hang detector's dumps while it lives.
pub fn register(s: &Arc<Scheduler>) {
    let mut list = SCHEDULERS.lock().unwrap_or_else(|e| e.into_inner());
    list.retain(|w| w.strong_count() > 0);
    list.push(Arc::downgrade(s));
}

/// Every scheduler alive now.
pub fn schedulers() -> Vec<Arc<Scheduler>> {
    let list = SCHEDULERS.lock().unwrap_or_else(|e| e.into_inner());
    list.iter().filter_map(|w| w.upgrade()).collect()
}

// ---- a round ----

/// What one round's actors share.
pub struct Round {
    pub number: u64,
    pub seed: u64,
    pub sched: Arc<Scheduler>,
    pub counts: Arc<SchedCounts>,
    stop: AtomicBool,
    pub sync: syncs::Shared,
    pub net: net::Shared,
}

impl Round {
    /// Whether the actors should wind down: the round is over, or a check failed.
    pub fn stopping(&self) -> bool {
        self.stop.load(Ordering::SeqCst) || acct::aborted()
    }

    /// Whether the caller is a fiber of the main scheduler (where `fibra::spawn`,
    /// `spawn_local`, `scope` and `JoinSet::spawn` reach it).
    pub fn in_fiber(&self) -> bool {
        fibra::Fiber::current().is_some()
            && fibra::current_worker().is_some()
            && std::thread::current().name().is_some_and(|n| {
                n.strip_prefix(MAIN_NAME)
                    .is_some_and(|r| r.starts_with('-'))
            })
    }

    /// Runs `f` as a tracked task of the main scheduler, one way or another: `fibra::spawn`
    /// (from its fibers), `Scheduler::spawn`, or a named task.
    #[track_caller]
    pub fn spawn<T: Send + 'static>(
        &self,
        rng: &mut Rng,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Tracked<T> {
        let (ticket, stub) = Ticket::new(&self.counts);
        let body = wrap(ticket, f);
        let handle = match rng.below(4) {
            0 | 1 if self.in_fiber() => fibra::spawn(body),
            2 => match self.sched.task().name("soak-task").submit(body, None) {
                Ok(h) => h,
                Err(e) => panic!("the main scheduler refused a task: {e}"),
            },
            _ => self.sched.spawn(body),
        };
        Tracked { handle, stub }
    }

    /// Runs `f` as a tracked task of the main scheduler, on worker `pin` if given.
    #[track_caller]
    pub fn submit<T: Send + 'static>(
        &self,
        pin: Option<usize>,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Tracked<T> {
        let (ticket, stub) = Ticket::new(&self.counts);
        match self.sched.submit(wrap(ticket, f), pin) {
            Ok(handle) => Tracked { handle, stub },
            Err(e) => panic!("the main scheduler refused a task: {e}"),
        }
    }
}

/// The areas, each with its actors' operations.
#[derive(Clone, Copy, Debug)]
enum Area {
    Tasks,
    Sync,
    Chans,
    Net,
    Misc,
    Threads,
}

impl Area {
    const FIBERS: [Area; 5] = [Area::Tasks, Area::Sync, Area::Chans, Area::Net, Area::Misc];

    /// Runs one operation of this area. The operation chooses, and makes its own choices,
    /// with a stream forked from the actor's: what an operation draws depends on timing (a
    /// retry after a full channel, say), but the actor's n-th operation does not.
    fn step(self, r: &Arc<Round>, rng: &mut Rng) {
        let mut rng = rng.fork();
        let rng = &mut rng;
        let op = match self {
            Area::Tasks => tasks::step(r, rng),
            Area::Sync => syncs::step(r, rng),
            Area::Chans => chans::step(r, rng),
            Area::Net => net::step(r, rng),
            Area::Misc => misc::step(r, rng),
            Area::Threads => thread_step(r, rng),
        };
        did(op);
    }
}

/// A thread actor's operation: any area's that works from a plain thread.
fn thread_step(r: &Arc<Round>, rng: &mut Rng) -> Op {
    match rng.below(5) {
        0 => tasks::thread_step(r, rng),
        1 => syncs::step(r, rng),
        2 => chans::step(r, rng),
        3 => net::step(r, rng),
        _ => misc::step(r, rng),
    }
}

/// The soak's state between rounds.
struct Soak {
    opts: Options,
    sched: Arc<Scheduler>,
    counts: Arc<SchedCounts>,
    baseline: Option<Resources>,
    rounds: u64,
    last: Option<Resources>,
    peak_rss_kib: u64,
    peak_heap: u64,
    /// How long the last round's actors took to finish their operations once told to stop.
    wind_down: Duration,
}

/// Runs the soak; true if every check held.
pub fn run(opts: &Options) -> bool {
    acct::set_seed(opts.seed);
    println!(
        "soak: seed {} ({} s, {} workers, {} actors per area; replay with --seed {})",
        opts.seed, opts.seconds, opts.threads, opts.actors, opts.seed
    );
    hook::install();
    // Short, so that the pool's threads come and go within a round and are gone at
    // quiescence, where the thread count is compared with the baseline.
    fibra::unblock::set_keep_alive(Duration::from_millis(200));
    let started = Instant::now();
    let sched = Arc::new(
        Scheduler::builder()
            .threads(opts.threads)
            .name(MAIN_NAME)
            // A soak on a loaded machine: the OS may keep a worker off its CPU for longer
            // than the default 100 ms, which the watchdog would report (it does not fail).
            .watchdog(Duration::from_secs(2))
            .build()
            .expect("the main scheduler"),
    );
    sched.start();
    register(&sched);
    let counts = SchedCounts::new(MAIN_NAME);
    let watcher = watch::start(sched.clone(), counts.clone(), opts.hang);
    let mut soak = Soak {
        opts: opts.clone(),
        sched,
        counts,
        baseline: None,
        rounds: 0,
        last: None,
        peak_rss_kib: 0,
        peak_heap: 0,
        wind_down: Duration::ZERO,
    };

    // The warm-up: every worker gets its own epoll instance (kept for good, see
    // `net::prime`), caches fill; then the baseline.
    net::prime(&soak.sched, &soak.counts);
    soak.round(opts.warmup);
    if let Some(r) = soak.quiesce("warm-up") {
        println!("soak: baseline after the warm-up round: {r}");
        soak.baseline = Some(r);
    }
    let deadline = started + Duration::from_secs(opts.seconds);
    while !acct::aborted() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left < Duration::from_millis(500) {
            break;
        }
        soak.round(left.min(opts.round));
        let label = format!("round {}", soak.rounds);
        let quiet = Instant::now();
        if let Some(r) = soak.quiesce(&label) {
            println!(
                "soak: after {label} ({:.0} s; wound down in {:.1} s, quiet {:.1} s later): \
                 {r}; {} ops so far",
                started.elapsed().as_secs_f64(),
                soak.wind_down.as_secs_f64(),
                quiet.elapsed().as_secs_f64(),
                ACCT.ops.iter().map(|c| c.get()).sum::<u64>()
            );
        }
    }
    soak.sched.stop();
    watcher.stop();
    let failures = acct::failures();
    summary(&soak, started.elapsed());
    if failures.is_empty() {
        println!("soak: PASSED (seed {})", opts.seed);
        true
    } else {
        println!(
            "soak: FAILED (seed {}): {} failed check(s); the first: {}",
            opts.seed,
            failures.len(),
            failures[0]
        );
        false
    }
}

impl Soak {
    /// One round of `length`: the actors, then their end.
    fn round(&mut self, length: Duration) {
        self.rounds += 1;
        let number = self.rounds;
        let seed = self.opts.seed;
        let mut server = net::Server::start(&self.sched, &self.counts);
        let r = Arc::new(Round {
            number,
            seed,
            sched: self.sched.clone(),
            counts: self.counts.clone(),
            stop: AtomicBool::new(false),
            sync: syncs::Shared::new(),
            net: server.shared(),
        });
        let mut actors = Vec::new();
        for (a, area) in Area::FIBERS.into_iter().enumerate() {
            for i in 0..self.opts.actors {
                let r2 = r.clone();
                let mut rng = Rng::stream(seed, number * 64 + a as u64, i);
                actors.push(r.submit(None, move || {
                    while !r2.stopping() {
                        area.step(&r2, &mut rng);
                    }
                }));
            }
        }
        let threads: Vec<_> = (0..self.opts.actors)
            .map(|i| {
                let r2 = r.clone();
                let mut rng = Rng::stream(seed, number * 64 + 63, i);
                std::thread::Builder::new()
                    .name(format!("soak-actor-{i}"))
                    .spawn(move || {
                        while !r2.stopping() {
                            Area::Threads.step(&r2, &mut rng);
                        }
                    })
                    .expect("a thread actor")
            })
            .collect();
        let end = Instant::now() + length;
        while Instant::now() < end && !acct::aborted() {
            std::thread::sleep(Duration::from_millis(20));
        }
        r.stop.store(true, Ordering::SeqCst);
        let stopped = Instant::now();
        for a in actors {
            if a.join("an actor").completed().is_none() {
                fail("an actor fiber did not complete".into());
            }
        }
        for t in threads {
            if t.join().is_err() {
                fail("a thread actor panicked".into());
            }
        }
        syncs::end_of_round(&r);
        drop(r);
        server.stop();
        self.wind_down = stopped.elapsed();
    }

    /// Waits until everything submitted has ended and the blocking pool's threads are gone,
    /// then checks the accounts and the resources. Returns the resources read.
    fn quiesce(&mut self, label: &str) -> Option<Resources> {
        watch::quiescing(true);
        let r = self.quiesce_checked(label);
        watch::quiescing(false);
        r
    }

    fn quiesce_checked(&mut self, label: &str) -> Option<Resources> {
        let limit = self.opts.hang;
        let sched = self.sched.clone();
        let counts = self.counts.clone();
        let alive = || {
            let m = sched.metrics();
            (counts.submitted.get() - counts.resolved()) as usize + m.live_tasks()
        };
        if !wait_patiently(
            limit,
            &format!("{label}: waiting for the tasks to end"),
            alive,
        ) {
            fail(format!(
                "{label}: {} of {} tasks still alive after the round ended; the dump:\n{}",
                counts.submitted.get() - counts.resolved(),
                counts.submitted.get(),
                sched.dump()
            ));
            return None;
        }
        let pool_gone = wait_patiently(limit, &format!("{label}: the blocking pool"), || {
            fibra::unblock::threads()
        });
        check!(
            pool_gone,
            "{label}: {} blocking-pool threads still alive",
            fibra::unblock::threads()
        );
        // Parked fibers' stacks and timers go as their workers publish their gauges.
        wait_patiently(limit, &format!("{label}: stacks and timers"), || {
            let m = sched.metrics();
            m.stacks_in_use() + m.timers()
        });
        self.check_accounts(label);
        let now = match self.baseline {
            Some(base) => {
                let off =
                    |r: Resources| r.fds.abs_diff(base.fds) + r.threads.abs_diff(base.threads);
                let settled = wait_patiently(limit, &format!("{label}: fds and threads"), || {
                    off(res::read())
                });
                let r = self.read_rss();
                check!(
                    settled,
                    "{label}: resources {r}, the baseline was {base} (fds and threads must match)"
                );
                let slack = self.opts.rss_slack_mib() * 1024;
                check!(
                    r.rss_kib <= base.rss_kib + slack,
                    "{label}: RSS {} KiB is more than {} MiB above the baseline's {} KiB",
                    r.rss_kib,
                    self.opts.rss_slack_mib(),
                    base.rss_kib
                );
                check!(
                    r.heap <= base.heap + (self.opts.heap_slack_mib << 20),
                    "{label}: the live heap, {} bytes, is more than {} MiB above the \
                     baseline's {} bytes",
                    r.heap,
                    self.opts.heap_slack_mib,
                    base.heap
                );
                r
            }
            None => {
                // The baseline: wait until fds and threads hold still for a moment.
                let mut last = res::read();
                let mut steady = 0;
                let deadline = Instant::now() + limit;
                while steady < 5 && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(50));
                    let r = res::read();
                    steady = if (r.fds, r.threads) == (last.fds, last.threads) {
                        steady + 1
                    } else {
                        0
                    };
                    last = r;
                }
                self.read_rss()
            }
        };
        self.last = Some(now);
        Some(now)
    }

    /// Resources, RSS read after trimming the allocator.
    fn read_rss(&mut self) -> Resources {
        res::trim_allocator();
        let r = res::read();
        self.peak_rss_kib = self.peak_rss_kib.max(r.rss_kib);
        self.peak_heap = self.peak_heap.max(r.heap);
        r
    }

    /// The accounts at quiescence: every equation that must hold exactly.
    fn check_accounts(&self, label: &str) {
        let c = &self.counts;
        let m = self.sched.metrics();
        let finished: u64 = m.workers().iter().map(|w| w.finished()).sum();
        check!(
            m.spawned() == c.submitted.get(),
            "{label}: the scheduler counts {} tasks spawned, the soak submitted {}",
            m.spawned(),
            c.submitted.get()
        );
        check!(
            finished == m.spawned(),
            "{label}: the workers count {finished} tasks finished of {} spawned",
            m.spawned()
        );
        check!(
            m.live_tasks() == 0,
            "{label}: {} live tasks",
            m.live_tasks()
        );
        check!(
            c.resolved() == c.submitted.get(),
            "{label}: {} tasks submitted, {} ended",
            c.submitted.get(),
            c.resolved()
        );
        check!(
            ACCT.completed.get() + ACCT.cancelled.get() + ACCT.panicked.get()
                == ACCT.submitted.get(),
            "{label}: of {} tasks (all schedulers) {} completed, {} cancelled, {} panicked",
            ACCT.submitted.get(),
            ACCT.completed.get(),
            ACCT.cancelled.get(),
            ACCT.panicked.get()
        );
        for k in acct::Kind::ALL {
            let c = acct::msgs(k);
            check!(
                c.ended() == c.made.get(),
                "{label}: {}: {} messages made, {} ended (received {}, dropped {}, refused {}, \
                 unsent {})",
                k.name(),
                c.made.get(),
                c.ended(),
                c.received.get(),
                c.dropped.get(),
                c.refused.get(),
                c.unsent.get()
            );
        }
        let bc = ACCT.bc_received.get() + ACCT.bc_lagged.get() + ACCT.bc_dropped.get();
        check!(
            bc == ACCT.bc_deliveries.get(),
            "{label}: broadcast: {} deliveries, but {bc} received, lagged over or dropped",
            ACCT.bc_deliveries.get()
        );
        check!(
            ACCT.locals_made.get() == ACCT.locals_dropped.get(),
            "{label}: {} fiber-local values made, {} dropped",
            ACCT.locals_made.get(),
            ACCT.locals_dropped.get()
        );
        check!(
            ACCT.jobs_scheduled.get() == ACCT.jobs_ran.get() + ACCT.jobs_dropped.get(),
            "{label}: {} timer jobs scheduled, {} ran, {} dropped",
            ACCT.jobs_scheduled.get(),
            ACCT.jobs_ran.get(),
            ACCT.jobs_dropped.get()
        );
        check!(
            ACCT.panics_hooked.get() == ACCT.panics_raised.get(),
            "{label}: {} panics raised by design, the panic hook saw {}",
            ACCT.panics_raised.get(),
            ACCT.panics_hooked.get()
        );
        let (v, e, w) = (
            ACCT.bytes_verified.get(),
            ACCT.bytes_echoed.get(),
            ACCT.bytes_written.get(),
        );
        check!(
            v <= e && e <= w,
            "{label}: echo bytes: {w} written, {e} echoed, {v} read back and matched"
        );
        check!(
            m.io_registrations() == 0,
            "{label}: {} fds still registered with the reactor",
            m.io_registrations()
        );
    }
}

/// Polls `left` every 10 ms until it is 0; false if it stood still for `limit` (less what
/// starvation explains, see `watch::Patience`).
pub fn wait_patiently(limit: Duration, what: &str, mut left: impl FnMut() -> usize) -> bool {
    let mut patience = watch::Patience::new(limit);
    let mut last = usize::MAX;
    loop {
        let now = left();
        if now == 0 {
            return true;
        }
        if now != last {
            last = now;
            patience.reset();
        } else if patience.exhausted(what) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The summary at the end.
fn summary(soak: &Soak, took: Duration) {
    let a = &ACCT;
    println!("soak: summary");
    println!(
        "  seed {}, {:.1} s, {} rounds (the first a warm-up)",
        soak.opts.seed,
        took.as_secs_f64(),
        soak.rounds
    );
    println!("  operations:");
    for op in Op::ALL {
        println!("    {:<26} {:>10}", op.name(), a.ops[*op as usize].get());
    }
    println!(
        "  tasks: {} submitted: {} completed, {} cancelled ({} before they started), {} panicked by design",
        a.submitted.get(),
        a.completed.get(),
        a.cancelled.get(),
        a.cancelled_unstarted.get(),
        a.panicked.get()
    );
    let m = soak.sched.metrics();
    println!(
        "  main scheduler's metrics: {} spawned, {} finished; the soak submitted {} to it",
        m.spawned(),
        m.workers().iter().map(|w| w.finished()).sum::<u64>(),
        soak.counts.submitted.get()
    );
    println!(
        "  panics by design: {} raised, {} seen by the hook; unexpected panics: {}",
        a.panics_raised.get(),
        a.panics_hooked.get(),
        a.panics_unexpected.get()
    );
    println!("  messages (made = received + dropped with the receiver + refused by a failed send + unsent by a select):");
    for k in acct::Kind::ALL {
        let c = acct::msgs(k);
        println!(
            "    {:<18} made {:>9}, sent {:>9}, received {:>9}, dropped {:>7}, refused {:>7}, unsent {:>6}",
            k.name(),
            c.made.get(),
            c.sent(),
            c.received.get(),
            c.dropped.get(),
            c.refused.get(),
            c.unsent.get()
        );
    }
    println!(
        "    broadcast          deliveries {}, received {}, lagged over {}, dropped with the receiver {}; {} sends without receivers",
        a.bc_deliveries.get(),
        a.bc_received.get(),
        a.bc_lagged.get(),
        a.bc_dropped.get(),
        a.bc_refused.get()
    );
    println!(
        "  tcp: {} connections ({} closed mid-stream by the client, {} by the server), \
         {} bytes written, {} echoed, {} read back and matched; pool: {} connects, {} broken",
        a.tcp_conns.get(),
        a.client_aborts.get(),
        a.server_aborts.get(),
        a.bytes_written.get(),
        a.bytes_echoed.get(),
        a.bytes_verified.get(),
        a.pool_connects.get(),
        a.pool_broken.get()
    );
    println!(
        "  fiber-locals: {} made, {} dropped; timer jobs: {} scheduled, {} ran, {} dropped ({} cancelled); parks: {} ({} timed out); second schedulers: {}",
        a.locals_made.get(),
        a.locals_dropped.get(),
        a.jobs_scheduled.get(),
        a.jobs_ran.get(),
        a.jobs_dropped.get(),
        a.jobs_cancelled.get(),
        a.parks.get(),
        a.parks_timed_out.get(),
        a.second_scheds.get()
    );
    match (soak.baseline, soak.last) {
        (Some(b), Some(l)) => println!(
            "  resources: baseline {b}; at the end {l}; growth: RSS {:+.1} MiB (slack {} MiB, \
             peak at quiescence {:.1} MiB), heap {:+.2} MiB (slack {} MiB, peak {:.2} MiB)",
            (l.rss_kib as f64 - b.rss_kib as f64) / 1024.0,
            soak.opts.rss_slack_mib(),
            soak.peak_rss_kib as f64 / 1024.0,
            (l.heap as f64 - b.heap as f64) / (1024.0 * 1024.0),
            soak.opts.heap_slack_mib,
            soak.peak_heap as f64 / (1024.0 * 1024.0)
        ),
        _ => println!("  resources: no baseline (the warm-up did not quiesce)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A short soak, in the test harness's process: a 1-s warm-up and 2 s of rounds, with
    /// every check of the long one (`cargo test` runs it; CI runs the long one for 60 s).
    #[test]
    fn a_short_soak_passes() {
        let mut o = Options::with_seed(clock_seed());
        o.seconds = 3;
        o.warmup = Duration::from_secs(1);
        o.round = Duration::from_secs(2);
        assert!(run(&o), "the soak failed with seed {}", o.seed);
    }
}
