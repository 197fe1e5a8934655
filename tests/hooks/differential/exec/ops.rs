//! The operations themselves, and the reference's decision whether each is safe to make.

use super::*;

/// How a wait may end: at once, after a bounded timeout, or only by readiness.
enum Wait {
    Bounded,
    /// Only readiness ends it: safe if something is ready now, or a helper makes it so.
    Unbounded,
}

fn poll_timeout(t: Timeout) -> (c_int, Wait) {
    match t {
        Timeout::Forever => (-1, Wait::Unbounded),
        Timeout::Ms(m) => (c_int::from(m), Wait::Bounded),
        Timeout::Invalid(_) => (-5, Wait::Unbounded),
        Timeout::Long => (60_000, Wait::Unbounded),
    }
}

fn ppoll_timeout(t: Timeout) -> (Option<libc::timespec>, Wait) {
    let ts = |s, ns| {
        Some(libc::timespec {
            tv_sec: s,
            tv_nsec: ns,
        })
    };
    match t {
        Timeout::Forever => (None, Wait::Unbounded),
        Timeout::Ms(m) => (ts(0, libc::c_long::from(m) * 1_000_000), Wait::Bounded),
        Timeout::Invalid(false) => (ts(0, 1_000_000_000), Wait::Bounded),
        Timeout::Invalid(true) => (ts(-1, 0), Wait::Bounded),
        Timeout::Long => (ts(60, 0), Wait::Unbounded),
    }
}

fn select_timeout(t: Timeout) -> (Option<libc::timeval>, Wait) {
    let tv = |s, us| {
        Some(libc::timeval {
            tv_sec: s,
            tv_usec: us,
        })
    };
    match t {
        Timeout::Forever => (None, Wait::Unbounded),
        Timeout::Ms(m) => (tv(0, libc::suseconds_t::from(m) * 1000), Wait::Bounded),
        // The C library takes a million microseconds and more as seconds (as the old
        // system call did): a wait of a second.
        Timeout::Invalid(false) => (tv(0, 1_000_000), Wait::Unbounded),
        Timeout::Invalid(true) => (tv(-1, 0), Wait::Bounded),
        Timeout::Long => (tv(60, 0), Wait::Unbounded),
    }
}

/// `select`'s sets: 2048 bits each, so that `n` may pass `FD_SETSIZE`.
type FdBits = [u64; 32];

fn bits_set(b: &mut FdBits, fd: c_int) {
    if (0..2048).contains(&fd) {
        b[fd as usize / 64] |= 1 << (fd % 64);
    }
}

impl Env<'_> {
    fn readable_mode(&self, fd: c_int) -> (bool, bool) {
        let fl = fds::fcntl(fd, libc::F_GETFL, 0);
        (
            fl & libc::O_ACCMODE != libc::O_WRONLY,
            fl & libc::O_NONBLOCK != 0,
        )
    }

    fn is_socket(&self, fd: c_int) -> bool {
        fds::sockopt(fd, libc::SOL_SOCKET, libc::SO_TYPE) >= 0
    }

    /// Whether a read of `total` bytes (`flags`: a socket call's; `plain`: `read` or
    /// `readv`, which return 0 at once when asked for nothing) on `fd` returns without
    /// waiting for ever.
    fn read_ok(
        &self,
        fd: c_int,
        total: usize,
        flags: c_int,
        iov: Option<&Iov>,
        plain: bool,
    ) -> Result<(), &'static str> {
        if !fds::is_open(fd)
            || matches!(iov, Some(Iov::BadArray(_) | Iov::BadCount(_)))
            || (plain && total == 0)
        {
            return Ok(());
        }
        let inet = fds::sockopt(fd, libc::SOL_SOCKET, libc::SO_DOMAIN) == libc::AF_INET;
        if flags & libc::MSG_ERRQUEUE != 0 && inet {
            // The error queue: looked at once.
            return Ok(());
        }
        let (readable, nonblock) = self.readable_mode(fd);
        if !readable || nonblock || flags & libc::MSG_DONTWAIT != 0 {
            return Ok(());
        }
        if self.is_socket(fd) && fds::has_timeout(fd, libc::SO_RCVTIMEO) {
            return Ok(());
        }
        let rev = fds::ready(fd, libc::POLLIN | libc::POLLPRI | libc::POLLRDHUP);
        if rev & libc::POLLPRI != 0 {
            return Err("urgent data: a read may wait past it");
        }
        if rev & (libc::POLLHUP | libc::POLLERR | libc::POLLRDHUP | libc::POLLNVAL) != 0 {
            return Ok(());
        }
        let all = flags & libc::MSG_WAITALL != 0
            && fds::sockopt(fd, libc::SOL_SOCKET, libc::SO_TYPE) == libc::SOCK_STREAM;
        if all {
            // A receive of nothing waits for a byte.
            if fds::queued(fd) as usize >= total.max(1) {
                return Ok(());
            }
            return Err("a MSG_WAITALL read would wait for ever");
        }
        if rev & libc::POLLIN != 0 {
            return Ok(());
        }
        Err("a read would wait for ever")
    }

    /// Whether a write of `total` bytes on `fd` returns without waiting for ever.
    fn write_ok(
        &self,
        fd: c_int,
        total: usize,
        flags: c_int,
        iov: Option<&Iov>,
    ) -> Result<(), &'static str> {
        if !fds::is_open(fd) || matches!(iov, Some(Iov::BadArray(_) | Iov::BadCount(_))) {
            return Ok(());
        }
        let fl = fds::fcntl(fd, libc::F_GETFL, 0);
        if fl & libc::O_ACCMODE == libc::O_RDONLY {
            return Ok(());
        }
        let Some(o) = self.obj(fd) else {
            return Err("an fd the harness does not know");
        };
        let obj = &self.objs[o];
        if obj.wr_shut {
            return Ok(());
        }
        // TCP past the peer's window would never settle (what it holds back goes later,
        // as the peer reads): blocking or not, the write must fit.
        if obj.kind == Kind::Tcp && fds::tcp_state(fd) != 7 {
            let peer = match self.open_fd_of(o ^ 1) {
                Some(p) => fds::queued(p).max(0) as usize,
                None if self.objs[o ^ 1].in_flight > 0 => usize::MAX / 2,
                None => 0,
            };
            if fds::outq(fd) != 0 || peer + total > 16384 {
                return Err("a TCP write past what the peer takes would not settle");
            }
        }
        if fl & libc::O_NONBLOCK != 0 || flags & libc::MSG_DONTWAIT != 0 {
            return Ok(());
        }
        let room = match obj.kind {
            Kind::Pipe => {
                let q = fds::queued(fd).max(0) as usize;
                if obj.packet || self.objs[o ^ 1].packet {
                    q == 0 && total <= 16384
                } else {
                    q + total <= 16384
                }
            }
            // Checked above (a connection a reset ended fails the write at once).
            Kind::Tcp => true,
            _ => {
                let sndbuf = fds::sockopt(fd, libc::SOL_SOCKET, libc::SO_SNDBUF).max(0) as usize;
                fds::outq(fd).max(0) as usize + 2 * total + 4096 <= sndbuf
            }
        };
        if room {
            return Ok(());
        }
        // A peer gone: the write fails at once.
        if self.open_fd_of(o ^ 1).is_none() && self.objs[o ^ 1].in_flight == 0 {
            return Ok(());
        }
        Err("a write would wait for room")
    }

    /// Whether no entry of `fds` is ready now (the reference's own `poll`, zero timeout).
    fn nothing_ready(&self, fds: &[(FdRef, i16)]) -> bool {
        let mut p = self.pollfds(fds);
        // SAFETY: a live array of its length.
        unsafe { (self.c.poll)(p.as_mut_ptr(), p.len() as libc::nfds_t, 0) == 0 }
    }

    fn pollfds(&self, fds: &[(FdRef, i16)]) -> Vec<libc::pollfd> {
        fds.iter()
            .map(|&(r, events)| libc::pollfd {
                fd: self.resolve(r),
                events,
                revents: 0,
            })
            .collect()
    }

    fn select_sets(
        &self,
        n: Option<c_int>,
        sets: &[Option<Vec<FdRef>>; 3],
    ) -> (c_int, [Option<FdBits>; 3]) {
        let mut hi = 0;
        let bits = sets.clone().map(|s| {
            s.map(|refs| {
                let mut b = [0u64; 32];
                for r in refs {
                    let fd = self.resolve(r);
                    bits_set(&mut b, fd);
                    if (0..2048).contains(&fd) {
                        hi = hi.max(fd + 1);
                    }
                }
                b
            })
        });
        (n.unwrap_or(hi), bits)
    }

    /// Whether `select` with zero timeout finds nothing (the reference's own call).
    fn select_nothing_ready(&self, n: Option<c_int>, sets: &[Option<Vec<FdRef>>; 3]) -> bool {
        let (n, mut bits) = self.select_sets(n, sets);
        let mut tv = libc::timeval {
            tv_sec: 0,
            tv_usec: 0,
        };
        let p = |b: &mut Option<FdBits>| {
            b.as_mut()
                .map_or(std::ptr::null_mut(), |b| b.as_mut_ptr().cast())
        };
        let [a, b, c] = &mut bits;
        // SAFETY: sets of 2048 bits or null, a live timeval.
        unsafe { (self.c.select)(n, p(a), p(b), p(c), &mut tv) == 0 }
    }

    /// Which object a poll's `Feed` helper writes into, for entry `k` of `fds` (its peer),
    /// if that makes the poll return as surely and as soon as it is done.
    fn feed_target(&self, fds: &[(c_int, i16)], k: u8) -> Option<usize> {
        let readers: Vec<_> = fds
            .iter()
            .filter(|(fd, ev)| *fd >= 0 && ev & (libc::POLLIN | libc::POLLRDNORM) != 0)
            .collect();
        if readers.is_empty() {
            return None;
        }
        let fd = readers[k as usize % readers.len()].0;
        let o = self.obj(fd)?;
        let peer = o ^ 1;
        let fl = fds::fcntl(fd, libc::F_GETFL, 0);
        if fl & libc::O_ACCMODE == libc::O_WRONLY
            || self.open_fd_of(peer).is_none()
            || self.objs[peer].wr_shut
        {
            return None;
        }
        // The peer must not be in the set: its own readiness must not matter.
        if fds.iter().any(|(f, _)| self.obj(*f) == Some(peer)) {
            return None;
        }
        Some(peer)
    }

    /// The reference's decision: `Err(why)` if `op` could wait for ever.
    pub(super) fn gate(&self, op: &Op) -> Result<(), &'static str> {
        let iov_total = |iov: &Iov| match iov {
            Iov::Lens(l) | Iov::BadBase(l, _) => l.iter().map(|&n| n as usize).sum(),
            _ => 0,
        };
        let sock_flags = |how: &Plain| match how {
            Plain::Sock(f) | Plain::SockTo(f) => *f,
            _ => 0,
        };
        match op {
            Op::Read { fd, len, how } => {
                let plain = matches!(how, Plain::Rw | Plain::Bad);
                self.read_ok(
                    self.resolve(*fd),
                    *len as usize,
                    sock_flags(how),
                    None,
                    plain,
                )
            }
            Op::Readv { fd, iov } => {
                self.read_ok(self.resolve(*fd), iov_total(iov), 0, Some(iov), true)
            }
            Op::Recvmsg { fd, iov, flags, .. } => {
                self.read_ok(self.resolve(*fd), iov_total(iov), *flags, Some(iov), false)
            }
            Op::Write { fd, len, how } => {
                self.write_ok(self.resolve(*fd), *len as usize, sock_flags(how), None)
            }
            Op::Writev { fd, iov } => {
                self.write_ok(self.resolve(*fd), iov_total(iov), 0, Some(iov))
            }
            Op::Sendmsg { fd, iov, flags, .. } => {
                self.write_ok(self.resolve(*fd), iov_total(iov), *flags, Some(iov))
            }
            Op::Oob { fd } => self.write_ok(self.resolve(*fd), 1, 0, None),
            Op::Poll { fds, timeout } => match poll_timeout(*timeout).1 {
                Wait::Unbounded if self.nothing_ready(fds) => Err("a poll would wait for ever"),
                _ => Ok(()),
            },
            Op::Ppoll { fds, timeout, .. } => match ppoll_timeout(*timeout).1 {
                Wait::Unbounded if self.nothing_ready(fds) => Err("a ppoll would wait for ever"),
                _ => Ok(()),
            },
            Op::Select { n, sets, timeout } => match select_timeout(*timeout).1 {
                Wait::Unbounded if self.select_nothing_ready(*n, sets) => {
                    Err("a select would wait for ever")
                }
                _ => Ok(()),
            },
            Op::Close { fd } => self.close_ok(self.resolve(*fd)),
            Op::Dup2 { fd, to } | Op::Dup3 { fd, to, .. } => {
                let (fd, to) = (self.resolve(*fd), self.resolve_target(*to));
                if fd != to && fds::is_open(fd) {
                    self.close_ok(to)
                } else {
                    Ok(())
                }
            }
            Op::Deferred { op, helper, .. } => self.deferred_ok(op, *helper),
            _ => Ok(()),
        }
    }

    /// Closing `fd` must not close the last descriptor of an open file that is on its way
    /// in an `SCM_RIGHTS` message: the hooks document that they cannot know its mode then.
    fn close_ok(&self, fd: c_int) -> Result<(), &'static str> {
        match self.obj(fd) {
            Some(o) if self.objs[o].in_flight > 0 && self.fd_count(o) == 1 => {
                Err("closes the last fd of an open file in flight (a documented limit)")
            }
            _ => Ok(()),
        }
    }

    /// A deferred operation must wait until its helper acts, and then end as the helper's
    /// part decides, whenever it comes.
    fn deferred_ok(&self, op: &Op, helper: Helper) -> Result<(), &'static str> {
        const NO: &str = "a helper could not end the wait as surely";
        let blocking = |fd: c_int| {
            fds::is_open(fd)
                && fds::fcntl(fd, libc::F_GETFL, 0) & libc::O_NONBLOCK == 0
                && !fds::has_timeout(fd, libc::SO_RCVTIMEO)
                && !fds::has_timeout(fd, libc::SO_SNDTIMEO)
        };
        match (op, helper) {
            (Op::Poll { fds, .. } | Op::Ppoll { fds, .. }, Helper::Feed(_, k)) => {
                let p = self.pollfds(fds);
                let pairs: Vec<_> = p.iter().map(|p| (p.fd, p.events)).collect();
                match self.feed_target(&pairs, k) {
                    Some(_) if self.nothing_ready(fds) => Ok(()),
                    _ => Err(NO),
                }
            }
            (Op::Select { n, sets, .. }, Helper::Feed(_, k)) => {
                let (nn, _) = self.select_sets(*n, sets);
                let Some(read) = &sets[0] else { return Err(NO) };
                let mut all: Vec<(c_int, i16)> = read
                    .iter()
                    .map(|r| (self.resolve(*r), libc::POLLIN))
                    .filter(|(fd, _)| *fd < nn)
                    .collect();
                let readers = all.len();
                for s in sets[1..].iter().flatten() {
                    all.extend(s.iter().map(|r| (self.resolve(*r), 0)));
                }
                if readers == 0 || !self.select_nothing_ready(*n, sets) {
                    return Err(NO);
                }
                self.feed_target(&all, k).map(|_| ()).ok_or(NO)
            }
            (
                Op::Read { fd, .. } | Op::Readv { fd, .. } | Op::Recvmsg { fd, .. },
                Helper::Feed(..),
            ) => {
                let fd = self.resolve(*fd);
                let o = self.obj(fd).ok_or(NO)?;
                if !blocking(fd) || self.open_fd_of(o ^ 1).is_none() || self.objs[o ^ 1].wr_shut {
                    return Err(NO);
                }
                let (readable, _) = self.readable_mode(fd);
                let rev = fds::ready(fd, libc::POLLIN | libc::POLLPRI | libc::POLLRDHUP);
                if !readable || rev != 0 {
                    return Err(NO);
                }
                if let Op::Readv { iov, .. } | Op::Recvmsg { iov, .. } = op {
                    if !matches!(iov, Iov::Lens(_)) {
                        return Err(NO);
                    }
                }
                // `read` and `readv` of nothing return at once, before or after the feed.
                let nothing = match op {
                    Op::Read { len, .. } => *len == 0,
                    Op::Readv {
                        iov: Iov::Lens(l), ..
                    } => l.iter().all(|&n| n == 0),
                    _ => false,
                };
                if nothing {
                    return Err(NO);
                }
                Ok(())
            }
            (
                Op::Write { fd, .. } | Op::Writev { fd, .. } | Op::Sendmsg { fd, .. },
                Helper::Drain,
            ) => {
                let fd = self.resolve(*fd);
                let o = self.obj(fd).ok_or(NO)?;
                let fl = fds::fcntl(fd, libc::F_GETFL, 0);
                let obj = &self.objs[o];
                let peer = &self.objs[o ^ 1];
                // `sendmsg` needs a socket (a pipe's fails at once).
                let stream = match op {
                    Op::Sendmsg { .. } => matches!(obj.kind, Kind::UnixStream | Kind::Tcp),
                    _ => matches!(obj.kind, Kind::Pipe | Kind::UnixStream | Kind::Tcp),
                };
                if !blocking(fd)
                    || !stream
                    || fl & libc::O_ACCMODE == libc::O_RDONLY
                    || obj.wr_shut
                    || peer.rd_shut
                    || obj.packet
                    || peer.packet
                    || self.open_fd_of(o ^ 1).is_none()
                    || obj.in_flight > 0
                    || peer.in_flight > 0
                    || self.fd_count(o ^ 1) == 0
                {
                    return Err(NO);
                }
                if obj.kind == Kind::Tcp
                    && fds::ready(self.open_fd_of(o ^ 1).unwrap(), libc::POLLPRI) != 0
                {
                    return Err(NO);
                }
                Ok(())
            }
            _ => Err(NO),
        }
    }

    /// Makes operation `i`.
    pub(super) fn op(&mut self, i: usize, op: &Op) -> Outcome {
        let c = self.c;
        match op {
            Op::Write { fd, len, how } => {
                let fd = self.resolve(*fd);
                let data = pattern(i, *len as usize);
                let (p, n) = (data.as_ptr().cast::<c_void>(), data.len());
                // SAFETY: a live buffer of `n` bytes, or the unmapped page on purpose.
                let r = unsafe {
                    match how {
                        Plain::Rw => (c.write)(fd, p, n),
                        Plain::Sock(f) => (c.send)(fd, p, n, *f),
                        Plain::SockTo(f) => (c.sendto)(fd, p, n, *f, std::ptr::null(), 0),
                        Plain::Bad => (c.write)(fd, bad(), n),
                    }
                };
                self.after(fd, outcome(r as i64))
            }
            Op::Read { fd, len, how } => {
                let fd = self.resolve(*fd);
                let mut buf = vec![SENTINEL; *len as usize];
                let (p, n) = (buf.as_mut_ptr().cast::<c_void>(), buf.len());
                // SAFETY: an all-zero sockaddr_storage is valid.
                let mut st: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
                let mut alen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
                // SAFETY: live buffers of their lengths, or the unmapped page on purpose.
                let r = unsafe {
                    match how {
                        Plain::Rw => (c.read)(fd, p, n),
                        Plain::Sock(f) => (c.recv)(fd, p, n, *f),
                        Plain::SockTo(f) => {
                            (c.recvfrom)(fd, p, n, *f, (&raw mut st).cast(), &mut alen)
                        }
                        Plain::Bad => (c.read)(fd, bad(), n),
                    }
                };
                let mut o = outcome(r as i64);
                o.data = buf;
                if let Plain::SockTo(_) = how {
                    if r >= 0 {
                        o.extra.push(i64::from(alen));
                        o.data.extend(addr_bytes(&st, alen));
                    }
                }
                self.after(fd, o)
            }
            Op::Writev { fd, iov } => {
                let fd = self.resolve(*fd);
                let b = Bufs::new(iov, |k, n| pattern(i * 8 + k, n));
                // SAFETY: the array and buffers `b` holds, or bad ones on purpose.
                let r = unsafe { (c.writev)(fd, b.ptr, b.count as c_int) };
                self.after(fd, outcome(r as i64))
            }
            Op::Readv { fd, iov } => {
                let fd = self.resolve(*fd);
                let b = Bufs::new(iov, |_, n| vec![SENTINEL; n]);
                // SAFETY: as above.
                let r = unsafe { (c.readv)(fd, b.ptr, b.count as c_int) };
                let mut o = outcome(r as i64);
                o.data = b.contents();
                self.after(fd, o)
            }
            Op::Sendmsg {
                fd,
                iov,
                flags,
                pass,
                name,
            } => {
                let fd = self.resolve(*fd);
                let passed = pass.map(|r| self.resolve(r));
                let b = Bufs::new(iov, |k, n| pattern(i * 8 + k, n));
                // SAFETY: an all-zero msghdr is valid.
                let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
                m.msg_iov = b.ptr;
                m.msg_iovlen = if b.count < 0 {
                    usize::MAX
                } else {
                    b.count as usize
                };
                let mut cbuf = [0u64; 4];
                if let Some(p) = passed {
                    // SAFETY: CMSG_SPACE of one int fits in 32 bytes; the header is written
                    // in place within `cbuf`.
                    unsafe {
                        m.msg_control = cbuf.as_mut_ptr().cast();
                        m.msg_controllen = libc::CMSG_SPACE(size_of::<c_int>() as u32) as usize;
                        let h = libc::CMSG_FIRSTHDR(&m);
                        (*h).cmsg_level = libc::SOL_SOCKET;
                        (*h).cmsg_type = libc::SCM_RIGHTS;
                        (*h).cmsg_len = libc::CMSG_LEN(size_of::<c_int>() as u32) as usize;
                        libc::CMSG_DATA(h).cast::<c_int>().write_unaligned(p);
                    }
                }
                let (mut addr, alen) = nobody();
                if *name {
                    m.msg_name = (&raw mut addr).cast();
                    m.msg_namelen = alen;
                }
                // SAFETY: `m` and everything it points to are live, or bad on purpose.
                let r = unsafe { (c.sendmsg)(fd, &m, *flags) };
                if r >= 0 {
                    if let Some(o) = passed.and_then(|p| self.obj(p)) {
                        self.objs[o].in_flight += 1;
                    }
                }
                self.after(fd, outcome(r as i64))
            }
            Op::Recvmsg {
                fd,
                iov,
                flags,
                control,
                name,
            } => {
                let fd = self.resolve(*fd);
                let b = Bufs::new(iov, |_, n| vec![SENTINEL; n]);
                // SAFETY: an all-zero msghdr and sockaddr_storage are valid.
                let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
                // SAFETY: as above.
                let mut st: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
                m.msg_iov = b.ptr;
                m.msg_iovlen = if b.count < 0 {
                    usize::MAX
                } else {
                    b.count as usize
                };
                let mut cbuf = vec![0u64; 8];
                // Filled with the sentinel, as bytes.
                // SAFETY: the vector's own bytes.
                unsafe { std::ptr::write_bytes(cbuf.as_mut_ptr().cast::<u8>(), SENTINEL, 64) };
                if *control > 0 {
                    m.msg_control = cbuf.as_mut_ptr().cast();
                    m.msg_controllen = *control as usize;
                }
                if *name {
                    m.msg_name = (&raw mut st).cast();
                    m.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
                }
                // SAFETY: `m` and everything it points to are live, or bad on purpose.
                let r = unsafe { (c.recvmsg)(fd, &mut m, *flags) };
                let mut o = outcome(r as i64);
                o.data = b.contents();
                if r >= 0 {
                    o.extra = vec![
                        i64::from(m.msg_flags),
                        m.msg_controllen as i64,
                        i64::from(m.msg_namelen),
                    ];
                    // SAFETY: the control buffer's bytes.
                    let cb = unsafe { std::slice::from_raw_parts(cbuf.as_ptr().cast::<u8>(), 64) };
                    o.data.extend_from_slice(&cb[..*control as usize]);
                    if *name {
                        o.data.extend(addr_bytes(&st, m.msg_namelen));
                    }
                    self.received(&m);
                }
                self.after(fd, o)
            }
            Op::Oob { fd } => {
                let fd = self.resolve(*fd);
                // SAFETY: a one-byte static buffer.
                let r = unsafe { (c.send)(fd, b"!".as_ptr().cast(), 1, libc::MSG_OOB) };
                self.after(fd, outcome(r as i64))
            }
            Op::Poll { fds, timeout } => {
                let mut p = self.pollfds(fds);
                // SAFETY: a live array of its length.
                let r = unsafe {
                    (c.poll)(
                        p.as_mut_ptr(),
                        p.len() as libc::nfds_t,
                        poll_timeout(*timeout).0,
                    )
                };
                let mut o = outcome(i64::from(r));
                o.extra = p.iter().map(|p| i64::from(p.revents)).collect();
                o
            }
            Op::Ppoll { fds, timeout, mask } => {
                let mut p = self.pollfds(fds);
                let (ts, _) = ppoll_timeout(*timeout);
                let mut ts_buf = ts.unwrap_or(libc::timespec {
                    tv_sec: 0,
                    tv_nsec: 0,
                });
                let tsp = if ts.is_some() {
                    &raw mut ts_buf
                } else {
                    std::ptr::null_mut()
                };
                // SAFETY: an all-zero sigset_t is a valid (empty) set.
                let set: libc::sigset_t = unsafe { std::mem::zeroed() };
                let setp = if *mask {
                    &raw const set
                } else {
                    std::ptr::null()
                };
                // SAFETY: live array, timespec and mask, or null.
                let r = unsafe { (c.ppoll)(p.as_mut_ptr(), p.len() as libc::nfds_t, tsp, setp) };
                let mut o = outcome(i64::from(r));
                o.extra = p.iter().map(|p| i64::from(p.revents)).collect();
                o.extra.extend([ts_buf.tv_sec, ts_buf.tv_nsec]);
                o
            }
            Op::Select { n, sets, timeout } => {
                let (n, mut bits) = self.select_sets(*n, sets);
                let (tv, _) = select_timeout(*timeout);
                let before = tv.unwrap_or(libc::timeval {
                    tv_sec: 0,
                    tv_usec: 0,
                });
                let mut after = before;
                let tvp = if tv.is_some() {
                    &raw mut after
                } else {
                    std::ptr::null_mut()
                };
                let p = |b: &mut Option<FdBits>| {
                    b.as_mut()
                        .map_or(std::ptr::null_mut(), |b| b.as_mut_ptr().cast())
                };
                let r = {
                    let [a, b, e] = &mut bits;
                    // SAFETY: sets of 2048 bits or null, a live timeval or null.
                    unsafe { (c.select)(n, p(a), p(b), p(e), tvp) }
                };
                let mut o = outcome(i64::from(r));
                for b in bits.iter().flatten() {
                    for w in b {
                        o.data.extend_from_slice(&w.to_le_bytes());
                    }
                }
                // The time left depends on timing: compared as what Linux promises.
                let us =
                    |t: libc::timeval| i128::from(t.tv_sec) * 1_000_000 + i128::from(t.tv_usec);
                let tv_ok = tv.is_none()
                    || if r == 0 {
                        us(after) == 0
                    } else {
                        us(after) <= us(before)
                    };
                o.extra.push(i64::from(tv_ok));
                o
            }
            Op::GetFl { fd } => {
                let fd = self.resolve(*fd);
                // SAFETY: F_GETFL takes no argument.
                let r = unsafe { (c.fcntl)(fd, libc::F_GETFL) };
                self.after(fd, outcome(i64::from(r)))
            }
            Op::SetFl { fd, flags } => {
                let fd = self.resolve(*fd);
                // SAFETY: F_SETFL takes an int.
                let r = unsafe { (c.fcntl)(fd, libc::F_SETFL, *flags) };
                if r == 0 && flags & libc::O_DIRECT != 0 {
                    if let Some(o) = self.obj(fd) {
                        self.objs[o].packet = true;
                    }
                }
                self.after(fd, outcome(i64::from(r)))
            }
            Op::Fionbio { fd, arg } => {
                let fd = self.resolve(*fd);
                let mut v: c_int = match arg {
                    Fion::Value(x) => *x,
                    _ => 0,
                };
                let p: *mut c_void = match arg {
                    Fion::Value(_) => (&raw mut v).cast(),
                    Fion::Null => std::ptr::null_mut(),
                    Fion::Bad => bad(),
                };
                // SAFETY: FIONBIO reads an int at `p` (live, null or unmapped on purpose).
                let r = unsafe { (c.ioctl)(fd, libc::FIONBIO, p) };
                self.after(fd, outcome(i64::from(r)))
            }
            Op::Dup { fd } => {
                let fd = self.resolve(*fd);
                // SAFETY: a number.
                let r = unsafe { (c.dup)(fd) };
                self.duplicated(fd, r);
                outcome(i64::from(r))
            }
            Op::Dup2 { fd, to } => {
                let (fd, to) = (self.resolve(*fd), self.resolve_target(*to));
                // SAFETY: numbers; `to` is the program's or refused.
                let r = unsafe { (c.dup2)(fd, to) };
                if fd != to {
                    self.duplicated(fd, r);
                }
                outcome(i64::from(r))
            }
            Op::Dup3 { fd, to, flags } => {
                let (fd, to) = (self.resolve(*fd), self.resolve_target(*to));
                // SAFETY: as above.
                let r = unsafe { (c.dup3)(fd, to, *flags) };
                self.duplicated(fd, r);
                let mut o = outcome(i64::from(r));
                o.extra.push(i64::from(fds::fcntl(to, libc::F_GETFD, 0)));
                o
            }
            Op::DupFd { fd, min, cloexec } => {
                let (fd, min) = (self.resolve(*fd), self.resolve_target(*min));
                let cmd = if *cloexec {
                    libc::F_DUPFD_CLOEXEC
                } else {
                    libc::F_DUPFD
                };
                // SAFETY: F_DUPFD takes an int.
                let r = unsafe { (c.fcntl)(fd, cmd, min) };
                self.duplicated(fd, r);
                outcome(i64::from(r))
            }
            Op::Close { fd } => {
                let fd = self.resolve(*fd);
                // SAFETY: a number of the program's, or one never open.
                let r = unsafe { (c.close)(fd) };
                if r == 0 {
                    self.fd_obj.remove(&fd);
                }
                outcome(i64::from(r))
            }
            Op::Shutdown { fd, how } => {
                let fd = self.resolve(*fd);
                // SAFETY: a number.
                let r = unsafe { libc::shutdown(fd, *how) };
                if r == 0 {
                    if let Some(o) = self.obj(fd) {
                        let obj = &mut self.objs[o];
                        obj.rd_shut |= *how != libc::SHUT_WR;
                        obj.wr_shut |= *how != libc::SHUT_RD;
                    }
                }
                self.after(fd, outcome(i64::from(r)))
            }
            Op::NewPair(spec) => {
                let (a, b) = self.make_pair(spec);
                let mut o = outcome(0);
                o.extra = vec![i64::from(a), i64::from(b)];
                o
            }
            Op::Deferred { op, helper, delay } => self.deferred(i, op, *helper, *delay),
        }
    }

    /// Adds what the kernel holds on `fd` after an operation on it (a deferred one's: once
    /// its helper is done).
    fn after(&self, fd: c_int, mut o: Outcome) -> Outcome {
        if !self.deferring {
            o.extra.push(i64::from(fds::queued(fd)));
        }
        o
    }

    /// `new` is `old`'s copy (if the call made one).
    fn duplicated(&mut self, old: c_int, new: c_int) {
        if new < 0 {
            return;
        }
        match self.obj(old) {
            Some(o) => {
                self.fd_obj.insert(new, o);
            }
            None => {
                self.fd_obj.remove(&new);
            }
        }
        self.handles.push(new);
    }

    /// Takes note of the descriptors that came in `m`'s control messages.
    fn received(&mut self, m: &libc::msghdr) {
        let mut got = Vec::new();
        // SAFETY: the kernel wrote `m`'s control buffer up to `msg_controllen`; the CMSG
        // macros stay within it.
        unsafe {
            let mut h = libc::CMSG_FIRSTHDR(m);
            while !h.is_null() {
                if (*h).cmsg_level == libc::SOL_SOCKET && (*h).cmsg_type == libc::SCM_RIGHTS {
                    let n = ((*h).cmsg_len - libc::CMSG_LEN(0) as usize) / size_of::<c_int>();
                    for k in 0..n {
                        got.push(libc::CMSG_DATA(h).cast::<c_int>().add(k).read_unaligned());
                    }
                }
                h = libc::CMSG_NXTHDR(m, h);
            }
        }
        for fd in got {
            // SAFETY: an all-zero stat is valid; fstat fills it.
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            // SAFETY: a live stat buffer.
            unsafe { libc::fstat(fd, &mut st) };
            let ident = (
                st.st_dev,
                st.st_ino,
                fds::fcntl(fd, libc::F_GETFL, 0) & libc::O_ACCMODE,
            );
            if let Some(o) = self.objs.iter().position(|o| o.ident == ident) {
                self.objs[o].in_flight = self.objs[o].in_flight.saturating_sub(1);
                self.fd_obj.insert(fd, o);
            }
            self.handles.push(fd);
        }
    }

    /// Runs `op` while a helper thread does its part on the peer, after `delay` ms.
    fn deferred(&mut self, i: usize, op: &Op, helper: Helper, delay: u8) -> Outcome {
        let (peer, kind, want) = match (op, helper) {
            (Op::Poll { fds, .. } | Op::Ppoll { fds, .. }, Helper::Feed(n, k)) => {
                let p = self.pollfds(fds);
                let pairs: Vec<_> = p.iter().map(|p| (p.fd, p.events)).collect();
                let peer = self.feed_target(&pairs, k).expect("the reference checked");
                (peer, Feed::Bytes(n as usize), 0)
            }
            (Op::Select { n, sets, .. }, Helper::Feed(len, k)) => {
                let (nn, _) = self.select_sets(*n, sets);
                let read = sets[0].as_ref().expect("the reference checked");
                let mut all: Vec<(c_int, i16)> = read
                    .iter()
                    .map(|r| (self.resolve(*r), libc::POLLIN))
                    .filter(|(fd, _)| *fd < nn)
                    .collect();
                for s in sets[1..].iter().flatten() {
                    all.extend(s.iter().map(|r| (self.resolve(*r), 0)));
                }
                let peer = self.feed_target(&all, k).expect("the reference checked");
                (peer, Feed::Bytes(len as usize), 0)
            }
            (
                Op::Read { fd, .. } | Op::Readv { fd, .. } | Op::Recvmsg { fd, .. },
                Helper::Feed(n, _),
            ) => {
                let fd = self.resolve(*fd);
                let o = self.obj(fd).expect("the reference checked");
                // A MSG_WAITALL receive on a stream waits for its whole buffer: feed it.
                let mut n = n as usize;
                if let Op::Recvmsg {
                    iov: Iov::Lens(l),
                    flags,
                    ..
                } = op
                {
                    if flags & libc::MSG_WAITALL != 0
                        && matches!(self.objs[o].kind, Kind::UnixStream | Kind::Tcp)
                    {
                        let total: usize = l.iter().map(|&x| x as usize).sum();
                        n = n.max(total.saturating_sub(fds::queued(fd).max(0) as usize));
                    }
                }
                (o ^ 1, Feed::Bytes(n), 0)
            }
            (Op::Write { fd, len, .. }, Helper::Drain) => {
                let fd = self.resolve(*fd);
                let o = self.obj(fd).expect("the reference checked");
                (o ^ 1, Feed::Drain, *len as usize)
            }
            (Op::Writev { fd, iov } | Op::Sendmsg { fd, iov, .. }, Helper::Drain) => {
                let fd = self.resolve(*fd);
                let o = self.obj(fd).expect("the reference checked");
                let total = match iov {
                    Iov::Lens(l) => l.iter().map(|&x| x as usize).sum(),
                    _ => 0,
                };
                (o ^ 1, Feed::Drain, total)
            }
            _ => unreachable!("the reference checked"),
        };
        let pfd = self.open_fd_of(peer).expect("the reference checked");
        let pkind = self.objs[peer].kind;
        let queued = if matches!(feed_of(&helper), Feed::Drain) {
            fds::queued(pfd).max(0) as usize
        } else {
            0
        };
        // The operation's result once it returned: a drain then takes what it wrote.
        let result = std::sync::Arc::new(std::sync::atomic::AtomicI64::new(i64::MIN));
        let seen = result.clone();
        let helper_thread = std::thread::spawn(move || {
            fds::nap(Duration::from_millis(u64::from(delay)));
            match kind {
                Feed::Bytes(n) => {
                    let sent = feed(pfd, &pattern(i + 1000, n));
                    (Vec::new(), sent as i64)
                }
                Feed::Drain => {
                    let got = drain_waiting(pfd, pkind, queued, want, &seen);
                    let n = got.len() as i64;
                    (got, n)
                }
            }
        });
        self.deferring = true;
        let mut o = self.op(i, op);
        self.deferring = false;
        result.store(o.ret, Ordering::Release);
        let (data, n) = helper_thread.join().expect("helper thread");
        // What is queued once the helper is done (before, it depends on its progress).
        if let Some(fd) = op_fd(op).map(|r| self.resolve(r)) {
            o.extra.push(i64::from(fds::queued(fd)));
        }
        o.data.extend(data);
        o.extra.push(n);
        o
    }
}

/// The descriptor a read or write names.
fn op_fd(op: &Op) -> Option<FdRef> {
    match op {
        Op::Read { fd, .. }
        | Op::Write { fd, .. }
        | Op::Readv { fd, .. }
        | Op::Writev { fd, .. }
        | Op::Recvmsg { fd, .. }
        | Op::Sendmsg { fd, .. } => Some(*fd),
        _ => None,
    }
}

#[derive(Clone, Copy)]
enum Feed {
    Bytes(usize),
    Drain,
}

fn feed_of(h: &Helper) -> Feed {
    match h {
        Helper::Feed(n, _) => Feed::Bytes(*n as usize),
        Helper::Drain => Feed::Drain,
    }
}

/// Writes all of `data` on `fd` with raw calls in one piece where it fits, waiting for
/// room (the fd may be non-blocking in the kernel); returns how much went.
fn feed(fd: c_int, data: &[u8]) -> usize {
    let mut done = 0;
    while done < data.len() {
        // SAFETY: the rest of a live buffer.
        let r = unsafe {
            libc::syscall(
                libc::SYS_sendto,
                fd,
                data[done..].as_ptr(),
                data.len() - done,
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                std::ptr::null::<libc::sockaddr>(),
                0,
            )
        };
        let r = if r < 0 && errno() == libc::ENOTSOCK {
            // A pipe: a plain write, once there is room.
            if !fds::wait_for(|| fds::ready(fd, libc::POLLOUT) != 0) {
                return done;
            }
            // SAFETY: as above.
            unsafe {
                libc::syscall(
                    libc::SYS_write,
                    fd,
                    data[done..].as_ptr(),
                    data.len() - done,
                )
            }
        } else {
            r
        };
        if r > 0 {
            done += r as usize;
        } else if r < 0 && errno() == libc::EAGAIN {
            if !fds::wait_for(|| fds::ready(fd, libc::POLLOUT) != 0) {
                return done;
            }
        } else {
            return done;
        }
    }
    set_errno(0);
    done
}

/// Reads from `fd` with raw calls what was `queued` there and what the write that goes on
/// meanwhile sends: `want` bytes, or once it returned (`result`), what it says it sent.
fn drain_waiting(
    fd: c_int,
    kind: Kind,
    queued: usize,
    want: usize,
    result: &std::sync::atomic::AtomicI64,
) -> Vec<u8> {
    let mut got = Vec::new();
    let mut sizes = Vec::new();
    let deadline = std::time::Instant::now() + fds::LIMIT;
    loop {
        let limit = match result.load(Ordering::Acquire) {
            i64::MIN => queued + want,
            r => queued + r.max(0) as usize,
        };
        if got.len() >= limit || std::time::Instant::now() >= deadline {
            break;
        }
        let piece = if fds::ready(fd, libc::POLLIN) != 0 {
            drain(fd, kind, limit - got.len(), &mut sizes)
        } else {
            Vec::new()
        };
        if piece.is_empty() {
            fds::nap(Duration::from_micros(200));
        }
        got.extend(piece);
    }
    got
}
