//! The batched socket calls `recvmmsg` and `sendmmsg`. On a socket that is blocking in the
//! user's view they wait as the kernel's do: a receive until all `vlen` messages came
//! (with `MSG_WAITFORONE`: until the first did), a send until all went. `MSG_DONTWAIT` makes
//! them the real call alone.

use super::msghdr::{iov_total, msg_from, received_fds, sent_fds};
use super::read_write::is_stream;
use crate::hook::{self, blocking, real, start, Blocking, READ, WRITE};
use libc::{c_int, c_uint, mmsghdr, timespec};
use std::mem::size_of;
use std::ptr::null_mut;
use std::time::{Duration, Instant};

/// The kernel takes at most this many messages in one call.
const MAX: usize = libc::UIO_MAXIOV as usize;

/// Receives as the kernel's blocking `recvmmsg` does: it waits for each message for as
/// long as it takes (bounded by `SO_RCVTIMEO`, not by `timeout`); after each, it returns
/// if `timeout` has passed since the call began (and writes back the time then left) or
/// if `MSG_WAITFORONE` was given (with whatever more had come).
#[no_mangle]
pub unsafe extern "C" fn recvmmsg(
    fd: c_int,
    msgs: *mut mmsghdr,
    n: c_uint,
    flags: c_int,
    timeout: *mut timespec,
) -> c_int {
    // SAFETY: the caller's arguments, passed on as they came.
    let real_call = || unsafe { real::recvmmsg(fd, msgs, n, flags, timeout) };
    if flags & libc::MSG_DONTWAIT != 0 {
        return real_call();
    }
    let begun = Instant::now();
    let (b, _) = match start(fd, READ, || 0, || real_call() as isize) {
        Ok(go_on) => go_on,
        Err(r) => return r as c_int,
    };
    // The timeout, read first as the kernel does (which refuses a bad one: its error).
    let end = if timeout.is_null() {
        None
    } else {
        let t = hook::readable(timeout.cast(), size_of::<timespec>())
            // SAFETY: readable, just checked.
            .then(|| unsafe { timeout.read() })
            .filter(|t| t.tv_sec >= 0 && (0..1_000_000_000).contains(&t.tv_nsec));
        match t {
            // A timeout too far for the clock never passes.
            Some(t) => Some(begun.checked_add(Duration::new(t.tv_sec as u64, t.tv_nsec as u32))),
            None => return real_call(),
        }
    };
    let n = (n as usize).min(MAX);
    // The time left as the last message came, for the caller's `timeout`.
    let mut left = None;
    let got = blocking(b, |b| {
        let mut done = 0;
        loop {
            // With a timeout, one message at a time: the kernel looks at the clock after
            // each, and leaves the rest queued once it passed.
            let batch = if end.is_some() { 1 } else { n - done };
            // SAFETY: the caller's array, past the messages already received.
            let r = b.run(|| unsafe {
                real::recvmmsg(fd, msgs.add(done), batch as c_uint, flags, null_mut()) as isize
            });
            if r <= 0 {
                // An error after some messages: the kernel returns those.
                return if done > 0 { done as isize } else { r };
            }
            for i in done..done + r as usize {
                // SAFETY: a message the kernel just filled in.
                unsafe { received_fds(&(*msgs.add(i)).msg_hdr) };
            }
            done += r as usize;
            if let Some(Some(end)) = end {
                let now = Instant::now();
                left = Some(end.saturating_duration_since(now));
                if now >= end {
                    return done as isize;
                }
            }
            if done == n || flags & libc::MSG_WAITFORONE != 0 {
                return done as isize;
            }
        }
    });
    if let (true, Some(left)) = (got > 0, left) {
        let left = timespec {
            tv_sec: left.as_secs() as libc::time_t,
            tv_nsec: left.subsec_nanos() as libc::c_long,
        };
        // SAFETY: a live timespec, viewed as its bytes.
        let bytes = unsafe {
            std::slice::from_raw_parts((&raw const left).cast::<u8>(), size_of::<timespec>())
        };
        // SAFETY: the caller gave `timeout` for the kernel to write the time left to.
        if !unsafe { hook::write_user(timeout.cast(), bytes) } {
            hook::set_errno(libc::EFAULT);
            return -1;
        }
    }
    got as c_int
}

/// Sends as the kernel's blocking `sendmmsg` does: every message, each whole. A stream
/// socket's messages go one at a time (a batch could send a message in part and the next
/// one after it); a datagram socket's go in batches.
#[no_mangle]
pub unsafe extern "C" fn sendmmsg(fd: c_int, msgs: *mut mmsghdr, n: c_uint, flags: c_int) -> c_int {
    // SAFETY: the caller's arguments.
    let r = unsafe { send_messages(fd, msgs, n, flags) };
    for i in 0..r.max(0) as usize {
        // SAFETY: a message the kernel sent: it took its msghdr and control part.
        unsafe { sent_fds(&(*msgs.add(i)).msg_hdr) };
    }
    r
}

/// The sending of [`sendmmsg`], whose caller then tells the fd table what descriptors went.
///
/// # Safety
/// The caller's arguments to `sendmmsg`.
unsafe fn send_messages(fd: c_int, msgs: *mut mmsghdr, n: c_uint, flags: c_int) -> c_int {
    // SAFETY: the caller's arguments, passed on as they came.
    let real_call = || unsafe { real::sendmmsg(fd, msgs, n, flags) };
    if flags & libc::MSG_DONTWAIT != 0 {
        return real_call();
    }
    let (b, _) = match start(fd, WRITE, || 0, || real_call() as isize) {
        Ok(go_on) => go_on,
        Err(r) => return r as c_int,
    };
    let n = (n as usize).min(MAX);
    let stream = is_stream(fd);
    blocking(b, |b| {
        let mut done = 0;
        while done < n {
            let r = if stream {
                // SAFETY: the caller's message `done`, within the array.
                unsafe { send_whole(b, fd, &mut *msgs.add(done), flags) }
            } else {
                // SAFETY: the caller's array, past the messages already sent.
                b.run(|| unsafe {
                    real::sendmmsg(fd, msgs.add(done), (n - done) as c_uint, flags) as isize
                })
            };
            if r <= 0 {
                // An error after some messages: the kernel returns those too.
                return if done > 0 { done as isize } else { r };
            }
            done += r as usize;
        }
        done as isize
    }) as c_int
}

/// Sends one message of a stream socket whole, as a blocking `sendmsg`, and sets its
/// `msg_len`: 1 once it went (in part, if an error ended it), or the error (-1).
///
/// # Safety
/// `m` is the caller's message, whose msghdr the kernel reads.
unsafe fn send_whole(b: &mut Blocking, fd: c_int, m: &mut mmsghdr, flags: c_int) -> isize {
    let mut sent = 0usize;
    loop {
        // SAFETY: the caller's msghdr; past `sent` bytes the rest goes on, without the
        // ancillary data the first part carried.
        let r = b.run(|| unsafe {
            msg_from(&mut m.msg_hdr, sent, None, |p| real::sendmsg(fd, p, flags))
        });
        if r < 0 {
            if sent == 0 {
                return r;
            }
            break;
        }
        sent += r as usize;
        // SAFETY: the caller's msghdr, which the kernel has read.
        if r == 0 || sent >= unsafe { iov_total(&m.msg_hdr) } {
            break;
        }
    }
    m.msg_len = sent as c_uint;
    1
}
