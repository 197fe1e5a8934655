//! The watcher: a plain thread that checks the counters' inequalities every 100 ms while the
//! actors run, and detects a hang — the progress counter standing still for the hang limit —
//! upon which it prints every live scheduler's dump and exits with status 3.
//!
//! A soak on a shared machine (under SCHED_IDLE, say) can be kept off the CPU for seconds.
//! So when progress has stood still for the limit, the watcher first asks the kernel how long
//! the soak's threads waited for a CPU meanwhile (`res::run_delays`): if one of them waited
//! for a quarter of that time or more, the stall is starvation, which it reports and waits
//! out (up to ten times the limit); a hang shows as threads that sleep with work to do. The
//! main thread's waits for quiescence keep the same patience ([`Patience`]) and report
//! themselves.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fibra::Scheduler;

use crate::acct::{msgs, Kind, SchedCounts, ACCT};
use crate::res;

pub struct Watcher {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

impl Watcher {
    pub fn stop(self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.thread.join();
    }
}

pub fn start(sched: Arc<Scheduler>, counts: Arc<SchedCounts>, hang: Duration) -> Watcher {
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    let thread = std::thread::Builder::new()
        .name("soak-watcher".into())
        .spawn(move || watch(&s, &sched, &counts, hang))
        .expect("the watcher thread");
    Watcher { stop, thread }
}

/// Set while the main thread waits for quiescence, which keeps its own patience.
static QUIESCING: AtomicBool = AtomicBool::new(false);

/// Marks the main thread's wait for quiescence (the watcher leaves hangs to it meanwhile).
pub fn quiescing(on: bool) {
    QUIESCING.store(on, Ordering::SeqCst);
}

/// Patience with a stall: exhausted once `limit` has passed, unless a thread of the soak
/// waited for a CPU for a quarter of that time or more (starvation: reported, and waited out
/// up to ten times the limit).
pub struct Patience {
    limit: Duration,
    since: Instant,
    delays: std::collections::HashMap<u64, u64>,
    starved: Duration,
}

impl Patience {
    pub fn new(limit: Duration) -> Patience {
        Patience {
            limit,
            since: Instant::now(),
            delays: res::run_delays(),
            starved: Duration::ZERO,
        }
    }

    /// Something moved: start again.
    pub fn reset(&mut self) {
        *self = Patience::new(self.limit);
    }

    /// How long the current stall has lasted.
    pub fn stalled(&self) -> Duration {
        self.since.elapsed()
    }

    /// Whether the stall has lasted too long; if it was starvation, says so and waits on.
    pub fn exhausted(&mut self, what: &str) -> bool {
        let stalled = self.since.elapsed();
        if stalled < self.limit {
            return false;
        }
        let waited = res::most_delayed(&self.delays, &res::run_delays());
        if waited * 4 >= stalled && self.starved < self.limit * 10 {
            eprintln!(
                "soak: {what}: nothing for {:.1} s, but a thread of the soak waited {:.1} s \
                 for a CPU meanwhile: starvation by other load, not a hang; waiting on",
                stalled.as_secs_f64(),
                waited.as_secs_f64()
            );
            self.starved += stalled;
            self.since = Instant::now();
            self.delays = res::run_delays();
            return false;
        }
        eprintln!(
            "soak: {what}: nothing for {:.1} s (the most a thread of the soak waited for a CPU \
             meanwhile: {:.1} s)",
            stalled.as_secs_f64(),
            waited.as_secs_f64()
        );
        true
    }
}

fn watch(stop: &AtomicBool, sched: &Scheduler, counts: &SchedCounts, hang: Duration) {
    let mut last = ACCT.progress.get();
    let mut patience = Patience::new(hang);
    while !stop.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(100));
        invariants(sched, counts);
        let now = ACCT.progress.get();
        if now != last || QUIESCING.load(Ordering::SeqCst) {
            last = now;
            patience.reset();
            continue;
        }
        if patience.exhausted("no progress") {
            hung(patience.stalled());
        }
    }
}

/// The hang report: the dumps, then exit.
fn hung(stalled: Duration) -> ! {
    eprintln!(
        "soak: HANG (seed {}): no progress for {:.1} s; the dump of every live scheduler \
         follows",
        crate::acct::seed(),
        stalled.as_secs_f64()
    );
    for s in crate::schedulers() {
        eprintln!("{}", s.dump());
        eprintln!("{}", s.metrics());
    }
    eprintln!(
        "soak: HANG (seed {}): exiting with status 3",
        crate::acct::seed()
    );
    std::process::exit(3)
}

/// The inequalities that hold at every moment, each side read in an order that keeps them
/// true (what ends is read before what starts it).
fn invariants(sched: &Scheduler, counts: &SchedCounts) {
    let a = &ACCT;
    let ended = a.completed.get() + a.cancelled.get() + a.panicked.get();
    let submitted = a.submitted.get();
    check!(
        ended <= submitted,
        "{ended} tasks ended, more than the {submitted} submitted"
    );
    for k in Kind::ALL {
        let c = msgs(k);
        let ended = c.ended();
        let made = c.made.get();
        check!(
            ended <= made,
            "{}: {ended} messages ended, more than the {made} made",
            k.name()
        );
    }
    let verified = a.bytes_verified.get();
    let echoed = a.bytes_echoed.get();
    let written = a.bytes_written.get();
    check!(
        verified <= echoed && echoed <= written,
        "echo bytes: {verified} matched, {echoed} echoed, {written} written"
    );
    let dropped = a.locals_dropped.get();
    let made = a.locals_made.get();
    check!(
        dropped <= made,
        "{dropped} fiber-local values dropped, {made} made"
    );
    let jobs = a.jobs_ran.get() + a.jobs_dropped.get();
    let scheduled = a.jobs_scheduled.get();
    check!(
        jobs <= scheduled,
        "{jobs} timer jobs ran or dropped, {scheduled} scheduled"
    );
    let hooked = a.panics_hooked.get();
    let raised = a.panics_raised.get();
    check!(
        hooked <= raised,
        "the panic hook saw {hooked} panics by design, {raised} were raised"
    );
    // fibra's metrics read first, the soak's count of submissions after: each submission is
    // counted by the soak before fibra sees it.
    let m = sched.metrics();
    let submitted = counts.submitted.get();
    let finished: u64 = m.workers().iter().map(|w| w.finished()).sum();
    check!(
        m.spawned() <= submitted,
        "the main scheduler counts {} tasks spawned, the soak submitted only {submitted}",
        m.spawned()
    );
    check!(
        finished <= m.spawned() && m.live_tasks() as u64 <= m.spawned(),
        "the main scheduler's metrics: {finished} finished, {} live, {} spawned",
        m.live_tasks(),
        m.spawned()
    );
}
