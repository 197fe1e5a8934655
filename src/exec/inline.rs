//! [`Inline`]: the no-op executor, which runs every job at once on the calling thread.

use super::Executor;

/// Runs every job at once, on the calling thread.
///
/// [`spawn`](Executor::spawn) runs the closure directly (no fiber) and returns a handle that
/// has already finished; a panic is caught into the handle. Inside a fiber the closure
/// simply runs in that fiber.
///
/// ```
/// use fibra::exec::{Executor, Inline};
/// let here = std::thread::current().id();
/// let h = Inline.spawn(move || std::thread::current().id() == here);
/// assert!(h.is_finished());
/// assert!(h.join().unwrap());
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Inline;

impl Executor for Inline {
    fn execute(&self, job: Box<dyn FnOnce() + Send>) {
        job()
    }
}
