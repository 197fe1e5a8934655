//! The harness of the property tests (`tests/channels/props.rs`, `tests/sync/props.rs`):
//! the runner's configuration, a sequential case run on a plain thread and in a fiber, and
//! the fibers and threads of a concurrent case.
#![allow(dead_code)]

use std::fmt::Debug;
use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed, TestCaseError, TestRunner};

use crate::common::{finish, started, with_deadline};
use fibra::{Fiber, Scheduler};

/// The runner's configuration: `cases` cases (unless `PROPTEST_CASES` asks for another
/// number, for a longer run by hand), and no regression files written into the repository:
/// a failure reports its minimal input and the seed that replays the run
/// (`PROPTEST_RNG_SEED`), which is random unless that variable gives it.
pub fn config(cases: u32) -> Config {
    let mut config = Config::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = cases;
    }
    config.failure_persistence = None;
    // Shrinking stops after 20 s, so that a failure is reported (with its smallest input so
    // far) before `with_deadline` gives up on the test at 60 s.
    config.max_shrink_time = 20_000;
    if config.rng_seed == RngSeed::Random {
        use std::hash::{BuildHasher, RandomState};
        config.rng_seed = RngSeed::Fixed(RandomState::new().hash_one(std::time::SystemTime::now()));
    }
    config
}

/// Checks `test` on the cases of `config(cases)`, values of the strategy `strategy()` makes
/// (made in the body, which `with_deadline` bounds), each with a started two-worker
/// scheduler.
pub fn check<S>(
    cases: u32,
    strategy: fn() -> S,
    test: fn(&Scheduler, S::Value) -> Result<(), TestCaseError>,
) where
    S: Strategy + 'static,
    S::Value: Debug + 'static,
{
    with_deadline(move || {
        let sched = started(2);
        let config = config(cases);
        let seed = config.rng_seed;
        let mut runner = TestRunner::new(config);
        let result = runner.run(&strategy(), |v| test(&sched, v));
        sched.stop();
        if let Err(e) = result {
            panic!("{e}\nreplay this run with PROPTEST_RNG_SEED={seed}");
        }
    });
}

/// Runs one sequential case on this (plain) thread, then in a fiber of `sched`.
pub fn in_both_contexts<V: Clone + Send + 'static>(
    sched: &Scheduler,
    v: V,
    run: fn(V) -> Result<(), String>,
) -> Result<(), TestCaseError> {
    run(v.clone()).map_err(|e| TestCaseError::fail(format!("on a plain thread: {e}")))?;
    sched
        .block_on(move || run(v))
        .map_err(|e| TestCaseError::fail(format!("in a fiber: {e}")))
}

/// Polls `fut` once with a waker that does nothing.
pub fn poll_once<F: Future>(fut: F) -> Poll<F::Output> {
    let mut fut = pin!(fut);
    fut.as_mut().poll(&mut Context::from_waker(Waker::noop()))
}

/// Takes handle `i` (modulo the count), if there is one.
pub fn pick<T>(v: &[T], i: u8) -> Option<usize> {
    (!v.is_empty()).then(|| usize::from(i) % v.len())
}

/// Where a producer or a consumer runs.
#[derive(Debug, Clone, Copy)]
pub enum Ctx {
    /// A fiber of the two-worker scheduler.
    Fiber,
    Thread,
}

pub fn ctx() -> impl Strategy<Value = Ctx> {
    prop_oneof![Just(Ctx::Fiber), Just(Ctx::Thread)]
}

/// A started fiber or thread.
pub enum Joiner<T> {
    Fiber(fibra::JoinHandle<T>),
    Thread(std::thread::JoinHandle<T>),
}

pub fn go<T: Send + 'static>(
    sched: &Scheduler,
    ctx: Ctx,
    f: impl FnOnce() -> T + Send + 'static,
) -> Joiner<T> {
    match ctx {
        Ctx::Fiber => Joiner::Fiber(sched.submit(f, None).expect("submit")),
        Ctx::Thread => Joiner::Thread(std::thread::spawn(f)),
    }
}

impl<T: Send + 'static> Joiner<T> {
    pub fn join(self) -> T {
        match self {
            Joiner::Fiber(h) => finish(h),
            Joiner::Thread(h) => h.join().expect("the thread panicked"),
        }
    }
}

/// Lets others run now and then: a yield or a zero sleep every `every`-th time (never if 0).
pub fn pause(every: u8, n: u32) {
    if every != 0 && n.is_multiple_of(u32::from(every)) {
        if n.is_multiple_of(2) {
            Fiber::yield_now();
        } else {
            fibra::sleep(Duration::ZERO);
        }
    }
}
