//! [`WaitOn`]: what a parked fiber waits for, recorded as it parks so that
//! [`Scheduler::dump`](crate::Scheduler::dump) can say it (public as `fibra::dump::WaitOn`).

use crate::fiber::FiberId;
use std::fmt;
use std::os::fd::RawFd;

/// What a parked fiber waits for, recorded when it parks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum WaitOn {
    /// [`sleep`](crate::sleep) or [`sleep_until`](crate::sleep_until) (its end is the
    /// entry's [`deadline`](crate::dump::Entry::deadline)).
    Sleep,
    /// Readiness of a file descriptor (fibra's sockets, [`crate::io`], hooked calls).
    Io {
        /// The descriptor.
        fd: RawFd,
        /// Waiting for it to be readable.
        readable: bool,
        /// Waiting for it to be writable.
        writable: bool,
    },
    /// A lock: the call that waits, such as `"Mutex::lock"` or `"Semaphore::acquire"`.
    Lock(&'static str),
    /// A channel: the call that waits, such as `"mpsc::Receiver::recv"`.
    Channel(&'static str),
    /// The end of another task ([`JoinHandle::join`](crate::JoinHandle::join)).
    Join(FiberId),
    /// [`park`](crate::park) or [`park_timeout`](crate::park_timeout) called directly.
    Park,
    /// A future polled by [`future::block_on`](crate::future::block_on).
    Future,
    /// A call running on the blocking pool ([`unblock`](crate::unblock()), files).
    Blocking,
    /// Anything else: the call that waits, such as `"Condvar::wait"`.
    Other(&'static str),
}

impl fmt::Display for WaitOn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WaitOn::Sleep => f.write_str("sleeping"),
            WaitOn::Io {
                fd,
                readable,
                writable,
            } => {
                let what = match (readable, writable) {
                    (true, true) => "readable or writable",
                    (false, true) => "writable",
                    _ => "readable",
                };
                write!(f, "waiting for fd {fd} {what}")
            }
            WaitOn::Lock(call) => write!(f, "waiting for a lock ({call})"),
            WaitOn::Channel(call) => write!(f, "waiting on a channel ({call})"),
            WaitOn::Join(id) => write!(f, "joining fiber {id}"),
            WaitOn::Park => f.write_str("parked (fibra::park)"),
            WaitOn::Future => f.write_str("awaiting a future (future::block_on)"),
            WaitOn::Blocking => f.write_str("waiting for the blocking pool (unblock)"),
            WaitOn::Other(call) => write!(f, "waiting in {call}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_on_reads_well() {
        let io = WaitOn::Io {
            fd: 5,
            readable: true,
            writable: false,
        };
        assert_eq!(io.to_string(), "waiting for fd 5 readable");
        assert_eq!(
            WaitOn::Lock("Mutex::lock").to_string(),
            "waiting for a lock (Mutex::lock)"
        );
    }
}
