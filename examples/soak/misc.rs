//! The rest: `unblock`, `time::Timer`, and a second scheduler started and stopped.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fibra::sync::{mpmc, mpsc, oneshot};
use fibra::Scheduler;

use crate::acct::{classify, designed_panic, fail, wrap, Kind, Msg, Op, SchedCounts, Ticket, ACCT};
use crate::rng::Rng;
use crate::tasks::work;
use crate::Round;

pub fn step(r: &Arc<Round>, rng: &mut Rng) -> Op {
    const OPS: [(Op, u32); 3] = [(Op::Unblock, 10), (Op::Timer, 5), (Op::SecondSched, 2)];
    let op = OPS[rng.weighted(&OPS.map(|o| o.1))].0;
    match op {
        Op::Unblock => unblock(r, rng),
        Op::Timer => timer(rng),
        _ => second(r, rng),
    }
    op
}

/// A sum of bytes, the slow way.
fn sum(data: &[u8]) -> u64 {
    data.iter().map(|&b| u64::from(b)).sum()
}

/// Blocking code on the pool (inline on a thread): borrowing the caller's data, sleeping,
/// panicking by design, several at once.
fn unblock(r: &Arc<Round>, rng: &mut Rng) {
    match rng.below(4) {
        0 => {
            let mut data = vec![0u8; rng.range_usize(0, 4096)];
            rng.fill(&mut data);
            let want = sum(&data);
            let got = fibra::unblock(|| sum(&data));
            check!(got == want, "unblock: a sum of {want} came back as {got}");
        }
        1 => {
            let d = Duration::from_micros(rng.range(0, 2000));
            fibra::unblock(|| std::thread::sleep(d));
        }
        2 => {
            let p = std::panic::catch_unwind(|| fibra::unblock(|| designed_panic("in unblock")));
            check!(
                p.is_err_and(|p| p.is::<crate::acct::Designed>()),
                "unblock: a panic by design came back as something else"
            );
        }
        _ => {
            let handles: Vec<_> = (0..rng.range(1, 6))
                .map(|_| {
                    let mut data = vec![0u8; rng.range_usize(0, 1024)];
                    rng.fill(&mut data);
                    r.spawn(rng, move || {
                        let want = sum(&data);
                        fibra::unblock(|| sum(&data)) == want
                    })
                })
                .collect();
            for h in handles {
                check!(
                    h.join("unblock").completed() == Some(true),
                    "unblock: a parallel sum went wrong"
                );
            }
        }
    }
}

/// One timer operation's job counts.
#[derive(Default)]
struct Jobs {
    ran: AtomicU64,
    dropped: AtomicU64,
    sends_ran: AtomicU64,
}

/// Carried by a timer job: counts it as run, or as dropped unrun.
struct JobGuard {
    jobs: Arc<Jobs>,
    ran: bool,
}

impl JobGuard {
    fn new(jobs: &Arc<Jobs>) -> JobGuard {
        ACCT.jobs_scheduled.inc();
        JobGuard {
            jobs: jobs.clone(),
            ran: false,
        }
    }
    fn run(&mut self) {
        self.ran = true;
        self.jobs.ran.fetch_add(1, Ordering::SeqCst);
        ACCT.jobs_ran.inc();
    }
}

impl Drop for JobGuard {
    fn drop(&mut self) {
        if !self.ran {
            self.jobs.dropped.fetch_add(1, Ordering::SeqCst);
            ACCT.jobs_dropped.inc();
        }
    }
}

/// A `Timer` with a few jobs (sends, a panic by design), some cancelled; shut down with or
/// without running what is left. Every job ran or was dropped, exactly as the handles and
/// `shutdown_now` say.
fn timer(rng: &mut Rng) {
    let timer = fibra::time::Timer::new();
    let (tx, rx) = mpsc::channel::<Msg>();
    let jobs = Arc::new(Jobs::default());
    let k = rng.range(1, 8);
    let handles: Vec<_> = (0..k)
        .map(|j| {
            let mut guard = JobGuard::new(&jobs);
            let delay = Duration::from_micros(rng.range(0, 20_000));
            if rng.chance(15) {
                timer.schedule(delay, move || {
                    guard.run();
                    designed_panic("a Timer job")
                })
            } else {
                let tx = tx.clone();
                timer.schedule(delay, move || {
                    guard.run();
                    guard.jobs.sends_ran.fetch_add(1, Ordering::SeqCst);
                    if let Err(e) = tx.send(Msg::new(Kind::Timer, 0, j)) {
                        e.0.refused();
                    }
                })
            }
        })
        .collect();
    let mut cancelled = 0;
    for h in &handles {
        if rng.chance(20) && h.cancel() {
            cancelled += 1;
            ACCT.jobs_cancelled.inc();
        }
    }
    // The timer's shutdown joins its thread: on the blocking pool, not on a worker.
    let now = rng.chance(40);
    let dropped_now = fibra::unblock(move || {
        if now {
            timer.shutdown_now()
        } else {
            timer.shutdown();
            0
        }
    });
    drop(tx);
    let mut received = 0;
    while let Ok(m) = rx.recv() {
        m.received();
        received += 1;
    }
    let (ran, dropped) = (
        jobs.ran.load(Ordering::SeqCst),
        jobs.dropped.load(Ordering::SeqCst),
    );
    check!(
        ran + dropped == k && dropped == cancelled + dropped_now as u64,
        "Timer: {k} jobs, {ran} ran, {dropped} dropped; {cancelled} cancelled, {dropped_now} \
         dropped by shutdown_now"
    );
    check!(
        received == jobs.sends_ran.load(Ordering::SeqCst),
        "Timer: {} sending jobs ran, {received} messages received",
        jobs.sends_ran.load(Ordering::SeqCst)
    );
}

static SECOND: AtomicU64 = AtomicU64::new(0);

/// A second scheduler: built, started (or not, at first), given tasks (pinned, sleeping,
/// panicking, waiting for the main scheduler's tasks, waiting for ever), joined from the
/// main scheduler too, then stopped — with `stop`, or `stop_timeout` that cancels what waits
/// for ever. Its metrics must agree with what was submitted to it, and its threads go.
fn second(r: &Arc<Round>, rng: &mut Rng) {
    ACCT.second_scheds.inc();
    let name = format!("soak2-{}", SECOND.fetch_add(1, Ordering::SeqCst));
    let threads = rng.range_usize(1, 3);
    let stack = [64 << 10, 128 << 10, 256 << 10][rng.below(3) as usize];
    let s2 = Arc::new(
        Scheduler::builder()
            .threads(threads)
            .name(&name)
            .stack_size(stack)
            .watchdog(Duration::from_secs(2))
            .build()
            .expect("a second scheduler"),
    );
    crate::register(&s2);
    let c2 = SchedCounts::new(&name);
    let started = rng.chance(80);
    if started {
        s2.start();
    }
    let forever = rng.chance(30);
    let (hold_tx, hold_rx) = mpmc::channel::<u8>();
    let mut handles = Vec::new();
    let mut feeders = Vec::new();
    for i in 0..rng.range(0, 10) {
        let kind = rng.below(if forever { 6 } else { 5 });
        let pin = if rng.chance(30) {
            Some(rng.below(threads as u64) as usize)
        } else {
            None
        };
        let mut trng = rng.fork();
        let (ticket, stub) = Ticket::new(&c2);
        let body: Box<dyn FnOnce() -> u64 + Send> = match kind {
            0 => Box::new(move || i),
            1 => Box::new(move || {
                fibra::sleep(Duration::from_micros(trng.range(0, 5000)));
                i
            }),
            2 => Box::new(|| designed_panic("a task of a second scheduler")),
            3 => {
                // Waits for a value from a task of the main scheduler.
                let (tx, rx) = oneshot::channel::<Msg>();
                let mut frng = rng.fork();
                feeders.push(r.spawn(rng, move || {
                    work(&mut frng);
                    if let Err(m) = tx.send(Msg::new(Kind::Oneshot, 1, i)) {
                        m.refused();
                    }
                }));
                Box::new(move || {
                    if let Ok(m) = rx.recv() {
                        m.received();
                    }
                    i
                })
            }
            4 => Box::new(move || {
                let want = trng.next_u64() & 0xffff;
                let got = fibra::unblock(|| want);
                work(&mut trng);
                got
            }),
            _ => {
                let rx = hold_rx.clone();
                Box::new(move || {
                    let _ = rx.recv(); // nothing comes: only the shutdown's cancel ends it
                    i
                })
            }
        };
        match s2.submit(wrap(ticket, body), pin) {
            Ok(h) => handles.push((h, stub)),
            Err(e) => fail(format!("{name} refused a task before its stop: {e}")),
        }
    }
    drop(hold_rx);
    // One of its tasks is joined by a task of the main scheduler.
    let mut cross = None;
    if !handles.is_empty() && rng.chance(40) {
        let (h, stub) = handles.swap_remove(rng.below(handles.len() as u64) as usize);
        cross = Some(r.spawn(rng, move || {
            let _ = classify(h.join(), &stub, "a second scheduler's task, joined across");
        }));
    }
    if started && rng.chance(30) {
        let (ticket, stub) = Ticket::new(&c2);
        let v = s2.block_on(wrap(ticket, || 5u64));
        check!(
            v == 5 && crate::acct::stub_says(&stub) == "completed",
            "{name}: block_on returned {v}"
        );
    } else if !started && rng.chance(50) {
        s2.start();
    }
    if rng.chance(50) {
        work(rng);
    }
    let cancelled = if forever {
        s2.stop_timeout(Duration::from_micros(rng.range(0, 20_000)))
    } else if rng.chance(50) {
        s2.stop();
        0
    } else {
        s2.stop_timeout(Duration::from_secs(60))
    };
    drop(hold_tx);
    for (h, stub) in handles {
        let _ = classify(h.join(), &stub, "a second scheduler's task");
    }
    if let Some(c) = cross {
        let _ = c.join("a cross-scheduler joiner");
    }
    for f in feeders {
        let _ = f.join("a feeder of a second scheduler's task");
    }
    check!(
        cancelled as u64 == c2.cancelled.get(),
        "{name}: stop_timeout says it cancelled {cancelled}, the tickets say {}",
        c2.cancelled.get()
    );
    let m = s2.metrics();
    let finished: u64 = m.workers().iter().map(|w| w.finished()).sum();
    check!(
        m.spawned() == c2.submitted.get()
            && finished == m.spawned()
            && m.live_tasks() == 0
            && c2.resolved() == c2.submitted.get(),
        "{name} after its stop: {} spawned, {finished} finished, {} live; the soak submitted \
         {}, of which {} ended",
        m.spawned(),
        m.live_tasks(),
        c2.submitted.get(),
        c2.resolved()
    );
}
