//! Helpers for the socket tests: run the same test body once with fibers on a fibra
//! scheduler and once with plain threads, since every fibra socket must work from both.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use crate::common::{finish, with_deadline};
use fibra::Scheduler;

/// Who runs a test's concurrent parts: fibers of one scheduler, or plain OS threads.
#[derive(Clone)]
pub enum Actors {
    Fibers(Arc<Scheduler>),
    Threads,
}

/// A spawned fiber or thread.
pub enum Task<T> {
    Fiber(fibra::JoinHandle<T>),
    Thread(std::thread::JoinHandle<T>),
}

impl<T> Task<T> {
    /// Waits for the task (a hung fiber fails the test after `crate::common::LIMIT`; a hung thread
    /// is caught by `with_deadline`) and returns its value; a panic fails the test.
    pub fn join(self) -> T {
        match self {
            Task::Fiber(h) => finish(h),
            Task::Thread(h) => h.join().expect("test thread panicked"),
        }
    }
}

impl Actors {
    pub fn spawn<T, F>(&self, f: F) -> Task<T>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        match self {
            Actors::Fibers(s) => Task::Fiber(s.submit(f, None).expect("scheduler running")),
            Actors::Threads => Task::Thread(std::thread::spawn(f)),
        }
    }

    pub fn is_fibers(&self) -> bool {
        matches!(self, Actors::Fibers(_))
    }
}

/// Runs `body` with fibers on a fresh `workers`-thread scheduler (the body itself in a
/// fiber), then again with plain threads, each under `with_deadline`.
pub fn fibers_and_threads(workers: usize, body: fn(&Actors)) {
    on_fibers(workers, body);
    on_threads(body);
}

/// Runs `body` in a fiber of a fresh `workers`-thread scheduler, with fibers as actors.
pub fn on_fibers(workers: usize, body: fn(&Actors)) {
    with_deadline(move || {
        let sched = Arc::new(
            Scheduler::builder()
                .threads(workers)
                .name("net-test")
                .build()
                .expect("build"),
        );
        sched.start();
        let actors = Actors::Fibers(sched.clone());
        sched.block_on(move || body(&actors));
        // Fibers a test leaves blocked on purpose (an acceptor) are cancelled.
        sched.stop_timeout(Duration::from_millis(100));
    });
}

/// Runs `body` on a plain thread, with threads as actors.
pub fn on_threads(body: fn(&Actors)) {
    with_deadline(move || body(&Actors::Threads));
}
