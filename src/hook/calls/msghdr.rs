//! The msghdr and iovec arithmetic of the vectored calls (`readv`/`writev`,
//! `recvmsg`/`sendmsg`): totals, the buffers past a partial transfer, a copy of a msghdr
//! that goes on from there, and the descriptors that came as ancillary data (told to the
//! fd table). Reads only what the caller passed, and only once the kernel would.

use crate::hook::{self, fd};
use libc::{c_int, c_void, iovec, msghdr};

/// Tells the fd table about the descriptors that came in `msg`'s ancillary data.
///
/// # Safety
/// `msg` points to a valid msghdr whose control buffer and length the kernel just wrote.
pub(super) unsafe fn received_fds(msg: *const msghdr) {
    // SAFETY: the caller's guarantee.
    unsafe { rights(msg, fd::received) }
}

/// Tells the fd table about the descriptors `msg`'s ancillary data sent: a copy of their
/// open files may come back to this process.
///
/// # Safety
/// `msg` points to a valid msghdr whose control buffer and length the kernel just took.
pub(super) unsafe fn sent_fds(msg: *const msghdr) {
    // SAFETY: the caller's guarantee.
    unsafe { rights(msg, fd::sent) }
}

/// Calls `f` with each descriptor of `msg`'s `SCM_RIGHTS` messages.
///
/// # Safety
/// As [`received_fds`]: the kernel just read or wrote `msg`'s control buffer and length.
unsafe fn rights(msg: *const msghdr, mut f: impl FnMut(c_int)) {
    // SAFETY: the caller's guarantee; the CMSG macros stay within `msg_controllen`.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c).cast::<c_int>();
                let bytes = (*c).cmsg_len.saturating_sub(libc::CMSG_LEN(0) as usize);
                for i in 0..bytes / std::mem::size_of::<c_int>() {
                    f(std::ptr::read_unaligned(data.add(i)));
                }
            }
            c = libc::CMSG_NXTHDR(msg, c);
        }
    }
}

/// Whether the caller's `msg` and its iovec array can be read, and the kernel takes their
/// count (at most `IOV_MAX`): else the real call answers for them.
///
/// # Safety
/// `msg` is null or points to memory the caller passed as a msghdr.
pub(super) unsafe fn readable_msg(msg: *const msghdr) -> bool {
    if !hook::readable(msg.cast(), std::mem::size_of::<msghdr>()) {
        return false;
    }
    // SAFETY: just checked readable.
    let (iov, n) = unsafe { ((*msg).msg_iov, (*msg).msg_iovlen) };
    n <= libc::UIO_MAXIOV as usize && hook::readable(iov.cast(), n * std::mem::size_of::<iovec>())
}

/// The total length of `msg`'s buffers (saturating: the kernel refuses more than it can
/// count); 0 for a null `msg`, which the kernel refuses.
///
/// # Safety
/// `msg` is null or points to a valid msghdr whose `msg_iov` holds `msg_iovlen` iovecs.
pub(super) unsafe fn iov_total(msg: *const msghdr) -> usize {
    if msg.is_null() {
        return 0;
    }
    // SAFETY: the caller's guarantee.
    let m = unsafe { &*msg };
    // SAFETY: as above.
    unsafe { iovecs(m.msg_iov, m.msg_iovlen) }
        .iter()
        .fold(0usize, |t, v| t.saturating_add(v.iov_len))
}

/// The caller's iovec array as a slice (empty for a null one).
///
/// # Safety
/// `iov` points to `n` valid iovecs, or `n` is 0.
pub(super) unsafe fn iovecs<'a>(iov: *const iovec, n: usize) -> &'a [iovec] {
    if iov.is_null() || n == 0 {
        &[]
    } else {
        // SAFETY: the caller's guarantee.
        unsafe { std::slice::from_raw_parts(iov, n) }
    }
}

/// The buffers of `iov` past their first `off` bytes.
pub(super) fn iov_rest(iov: &[iovec], mut off: usize) -> Vec<iovec> {
    let mut rest = Vec::with_capacity(iov.len());
    for v in iov {
        if off >= v.iov_len {
            off -= v.iov_len;
            continue;
        }
        rest.push(iovec {
            // SAFETY: `off` is below this buffer's length, so the pointer stays inside it.
            iov_base: unsafe { v.iov_base.byte_add(off) },
            iov_len: v.iov_len - off,
        });
        off = 0;
    }
    rest
}

/// Calls `call` with `msg` itself (`off` 0), or with a copy whose buffers start `off` bytes
/// on and which carries `control` as its ancillary data buffer, or none (a send's went with
/// the first part); no address (a stream's peer is fixed).
///
/// # Safety
/// `msg` points to a valid msghdr whose `msg_iov` holds `msg_iovlen` iovecs; `control` is
/// the caller's control buffer.
pub(super) unsafe fn msg_from(
    msg: *mut msghdr,
    off: usize,
    control: Option<(*mut c_void, usize)>,
    call: impl FnOnce(*mut msghdr) -> isize,
) -> isize {
    if off == 0 {
        return call(msg);
    }
    // SAFETY: the caller's guarantee.
    let m = unsafe { &*msg };
    // SAFETY: as above.
    let mut rest = iov_rest(unsafe { iovecs(m.msg_iov, m.msg_iovlen) }, off);
    // SAFETY: an all-zero msghdr is valid: no name, no control, no buffers yet.
    let mut part: msghdr = unsafe { std::mem::zeroed() };
    part.msg_iov = rest.as_mut_ptr();
    part.msg_iovlen = rest.len();
    if let Some((buf, len)) = control {
        part.msg_control = buf;
        part.msg_controllen = len;
    }
    call(&mut part)
}
