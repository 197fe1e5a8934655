//! Errors of fibra's public API: configuration errors from `Builder::build`, and the
//! refusal of `submit`, which always hands the closure back.

use std::fmt;

/// A scheduler configuration that cannot work, reported by [`Builder::build`](crate::Builder::build).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// `threads(0)`: a scheduler needs at least one worker.
    NoThreads,
    /// More workers than fibra supports.
    TooManyThreads {
        /// What was asked for.
        requested: usize,
        /// The largest supported count.
        maximum: usize,
    },
    /// A stack size below [`MIN_STACK_SIZE`](crate::MIN_STACK_SIZE).
    StackTooSmall {
        /// What was asked for, in bytes.
        requested: usize,
        /// The smallest allowed size, in bytes.
        minimum: usize,
    },
    /// A stack size so large it cannot be mapped on this machine.
    StackTooLarge {
        /// What was asked for, in bytes.
        requested: usize,
    },
    /// A thread name containing a NUL byte, which OS thread names cannot hold.
    InvalidName(String),
    /// `use_caller(true)` inside a scheduler's fiber: the building thread would become
    /// worker 0, but it runs worker 0's fibers only outside any fiber, and that thread is
    /// another scheduler's worker, where code never runs outside one.
    UseCallerInFiber,
    /// A worker time slice outside what the kernel takes (100 µs to 100 ms); see
    /// [`Builder::time_slice`](crate::Builder::time_slice).
    InvalidTimeSlice {
        /// What was asked for.
        requested: std::time::Duration,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NoThreads => {
                f.write_str("a scheduler needs at least one thread (threads(0) given)")
            }
            Error::TooManyThreads { requested, maximum } => {
                write!(
                    f,
                    "{requested} threads requested; fibra supports at most {maximum}"
                )
            }
            Error::StackTooSmall { requested, minimum } => write!(
                f,
                "stack size {requested} bytes is below the minimum of {minimum} bytes"
            ),
            Error::StackTooLarge { requested } => {
                write!(f, "stack size {requested} bytes is too large to map")
            }
            Error::InvalidTimeSlice { requested } => write!(
                f,
                "worker time slice {requested:?} is outside what the kernel takes (100 µs to 100 ms)"
            ),
            Error::InvalidName(name) => write!(f, "thread name {name:?} contains a NUL byte"),
            Error::UseCallerInFiber => f.write_str(
                "use_caller(true) inside a scheduler's fiber: the building thread could never \
                 run worker 0's fibers (build it on a plain thread, or without use_caller)",
            ),
        }
    }
}

impl std::error::Error for Error {}

/// Why [`Scheduler::submit`](crate::Scheduler::submit) refused a closure. Either way the
/// closure comes back, unrun, through [`into_inner`](SubmitError::into_inner).
pub enum SubmitError<F> {
    /// The scheduler is stopping or stopped.
    Stopped(F),
    /// The requested worker index is not below [`Scheduler::threads`](crate::Scheduler::threads).
    NoSuchThread(F),
    /// The task's stack size (from [`TaskBuilder::stack_size`](crate::TaskBuilder::stack_size))
    /// is out of range; the [`Error`] says how, as `Builder::build` would.
    InvalidStackSize(F, Error),
}

impl<F> SubmitError<F> {
    /// Gives the refused closure back.
    pub fn into_inner(self) -> F {
        match self {
            SubmitError::Stopped(f)
            | SubmitError::NoSuchThread(f)
            | SubmitError::InvalidStackSize(f, _) => f,
        }
    }
}

impl<F> fmt::Debug for SubmitError<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SubmitError::Stopped(_) => f.write_str("Stopped(..)"),
            SubmitError::NoSuchThread(_) => f.write_str("NoSuchThread(..)"),
            SubmitError::InvalidStackSize(_, e) => write!(f, "InvalidStackSize(.., {e:?})"),
        }
    }
}

impl<F> fmt::Display for SubmitError<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SubmitError::Stopped(_) => {
                f.write_str("the scheduler is stopped; the task was not run")
            }
            SubmitError::NoSuchThread(_) => {
                f.write_str("no worker thread with that index; the task was not run")
            }
            SubmitError::InvalidStackSize(_, e) => {
                write!(f, "invalid task stack size: {e}; the task was not run")
            }
        }
    }
}

impl<F> std::error::Error for SubmitError<F> {}

/// Why `spawn_when_readable` or `serve` (on [`TcpStream`](crate::net::TcpStream) or
/// [`UnixStream`](crate::net::unix::UnixStream)) registered nothing. The socket and the closure
/// come back, unrun, through [`into_inner`](WhenReadableError::into_inner).
pub enum WhenReadableError<S, F> {
    /// Not called from a fiber of a [`Scheduler`](crate::Scheduler): there is no scheduler to
    /// run the task on.
    NoScheduler(S, F),
    /// The calling fiber's scheduler is past waiting in its shutdown: it cancels what is
    /// left, so nothing new may wait.
    Stopped(S, F),
    /// The socket could not be registered with the reactor (`epoll_ctl` failed).
    Io(S, F, std::io::Error),
}

impl<S, F> WhenReadableError<S, F> {
    /// Gives the socket and the closure back.
    pub fn into_inner(self) -> (S, F) {
        match self {
            WhenReadableError::NoScheduler(s, f)
            | WhenReadableError::Stopped(s, f)
            | WhenReadableError::Io(s, f, _) => (s, f),
        }
    }
}

impl<S, F> fmt::Debug for WhenReadableError<S, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WhenReadableError::NoScheduler(..) => f.write_str("NoScheduler(..)"),
            WhenReadableError::Stopped(..) => f.write_str("Stopped(..)"),
            WhenReadableError::Io(_, _, e) => write!(f, "Io(.., {e:?})"),
        }
    }
}

impl<S, F> fmt::Display for WhenReadableError<S, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WhenReadableError::NoScheduler(..) => f.write_str(
                "spawn_when_readable or serve called outside a fiber of a fibra Scheduler; nothing registered",
            ),
            WhenReadableError::Stopped(..) => {
                f.write_str("the scheduler is stopped; nothing registered")
            }
            WhenReadableError::Io(_, _, e) => {
                write!(f, "cannot register the socket with the reactor: {e}")
            }
        }
    }
}

impl<S, F> std::error::Error for WhenReadableError<S, F> {}
