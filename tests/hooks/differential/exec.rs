//! Runs a program on one side and records what each operation returned: its result, `errno`,
//! the buffers it filled and what else it wrote (revents, fd sets, message flags).
//!
//! The reference side (the C library's own calls) decides which operations are safe to make:
//! one that could wait for ever (a blocking read with nothing to read, a poll with nothing
//! ready and no timeout) is skipped, on every side. The other sides replay that decision and
//! compare each step with the reference's as they go, stopping at the first difference.

use super::calls::Calls;
use super::fds::{self, errno, set_errno, HIGHS, UNUSED};
use super::program::{FdRef, Fion, Helper, Iov, Kind, Op, PairSpec, Plain, Program, Timeout};
use libc::{c_int, c_void, iovec};
use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// Which way a side makes its calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// The C library's own functions, on a plain thread: the reference.
    Real,
    /// The hooks, on a plain thread (they pass through).
    Plain,
    /// The hooks, in a fiber (they park the fiber).
    Fiber,
}

/// What one operation did.
#[derive(Clone, PartialEq, Eq)]
pub struct Outcome {
    pub ret: i64,
    /// `errno` after a failure (0 after a success: its value is unspecified then).
    pub errno: c_int,
    /// Buffers after the call (read buffers in full, sentinel bytes included), data a
    /// helper drained.
    pub data: Vec<u8>,
    /// Anything else the call wrote or the kernel holds after it.
    pub extra: Vec<i64>,
}

impl fmt::Debug for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let head: Vec<u8> = self.data.iter().copied().take(48).collect();
        write!(
            f,
            "ret {} errno {} data[{}] {:02x?}{} extra {:?}",
            self.ret,
            self.errno,
            self.data.len(),
            head,
            if self.data.len() > 48 { "…" } else { "" },
            self.extra
        )
    }
}

/// One step of a run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Not made: it could wait for ever (the reference's reason).
    Skipped(&'static str),
    Done(Outcome),
}

/// A side's run: its steps, then what the kernel held at the end.
#[derive(Clone, Debug, Default)]
pub struct Run {
    pub steps: Vec<Step>,
    pub digest: Vec<Outcome>,
    /// The step that differed from the reference's (the run stopped there).
    pub diverged: Option<usize>,
}

/// One end of a pair: what the harness knows of it.
struct Obj {
    kind: Kind,
    /// 0 or 1 (a pipe's end 0 reads).
    end: u8,
    /// `SCM_RIGHTS` messages carrying it not yet received.
    in_flight: u32,
    rd_shut: bool,
    wr_shut: bool,
    /// `O_DIRECT` was set on it (a pipe in packet mode: each write takes a buffer).
    packet: bool,
    /// `st_dev`, `st_ino` and the access mode: to find the object of a received fd.
    ident: (u64, u64, c_int),
}

/// An address no page is mapped at: what bad pointers point to.
fn bad() -> *mut c_void {
    static BAD: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *BAD.get_or_init(|| {
        // SAFETY: a fresh anonymous mapping, never accessible, never unmapped.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED, "harness: mmap");
        p as usize
    }) as *mut c_void
}

/// The bytes written by operation `seed`: distinct per operation and position.
fn pattern(seed: usize, n: usize) -> Vec<u8> {
    (0..n)
        .map(|i| (seed as u8).wrapping_mul(37) ^ (i as u8) ^ ((i >> 8) as u8).wrapping_mul(11))
        .collect()
}

/// What read buffers hold before a call.
const SENTINEL: u8 = 0xa5;

/// The result of a call returning `r` (and `errno` on failure).
fn outcome(r: i64) -> Outcome {
    Outcome {
        ret: r,
        errno: if r < 0 { errno() } else { 0 },
        data: Vec::new(),
        extra: Vec::new(),
    }
}

/// Buffers for a vectored call: the iovec array and the memory it points to.
struct Bufs {
    mem: Vec<Vec<u8>>,
    iov: Vec<iovec>,
    /// The array the call gets, and its count.
    ptr: *mut iovec,
    count: i64,
}

impl Bufs {
    /// Buffers shaped by `spec`, filled with `fill(i, len)`.
    fn new(spec: &Iov, mut fill: impl FnMut(usize, usize) -> Vec<u8>) -> Bufs {
        let (lens, bad_base): (Vec<usize>, Option<u8>) = match spec {
            Iov::Lens(l) => (l.iter().map(|&n| n as usize).collect(), None),
            Iov::BadBase(l, k) => (l.iter().map(|&n| n as usize).collect(), Some(*k)),
            Iov::BadArray(n) => {
                return Bufs {
                    mem: Vec::new(),
                    iov: Vec::new(),
                    ptr: bad().cast(),
                    count: i64::from(*n),
                }
            }
            Iov::BadCount(true) => (vec![1], None),
            Iov::BadCount(false) => (vec![1; libc::UIO_MAXIOV as usize + 1], None),
        };
        let mut mem: Vec<Vec<u8>> = lens.iter().enumerate().map(|(i, &n)| fill(i, n)).collect();
        let mut iov: Vec<iovec> = mem
            .iter_mut()
            .map(|m| iovec {
                iov_base: m.as_mut_ptr().cast(),
                iov_len: m.len(),
            })
            .collect();
        if let (Some(k), false) = (bad_base, iov.is_empty()) {
            let k = k as usize % iov.len();
            iov[k].iov_base = bad();
        }
        let count = if matches!(spec, Iov::BadCount(true)) {
            -1
        } else {
            iov.len() as i64
        };
        let ptr = iov.as_mut_ptr();
        Bufs {
            mem,
            iov,
            ptr,
            count,
        }
    }

    fn total(&self) -> usize {
        self.iov.iter().map(|v| v.iov_len).sum()
    }

    /// The buffers' contents, one after another.
    fn contents(&self) -> Vec<u8> {
        self.mem.concat()
    }
}

/// A `sockaddr_un` with an abstract name nobody binds: a send there fails.
fn nobody() -> (libc::sockaddr_un, libc::socklen_t) {
    // SAFETY: an all-zero sockaddr_un is valid.
    let mut a: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    a.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let name = b"fibra-fuzz-nobody";
    for (i, b) in name.iter().enumerate() {
        a.sun_path[i + 1] = *b as libc::c_char;
    }
    let len = std::mem::offset_of!(libc::sockaddr_un, sun_path) + 1 + name.len();
    (a, len as libc::socklen_t)
}

/// An address the kernel filled in, as compared: its bytes, with an IPv4 port (which
/// differs between sides) zeroed.
fn addr_bytes(st: &libc::sockaddr_storage, len: libc::socklen_t) -> Vec<u8> {
    let n = (len as usize).min(size_of::<libc::sockaddr_storage>());
    // SAFETY: the storage as bytes.
    let mut b = unsafe {
        std::slice::from_raw_parts((st as *const libc::sockaddr_storage).cast::<u8>(), n)
    }
    .to_vec();
    if st.ss_family == libc::AF_INET as libc::sa_family_t && b.len() >= 4 {
        b[2] = 0;
        b[3] = 0;
    }
    b
}

/// The state of one side's run.
pub struct Env<'a> {
    c: &'a Calls,
    /// Every fd number the program made, in order.
    handles: Vec<c_int>,
    objs: Vec<Obj>,
    /// Which object each open number is (as far as the calls' results say).
    fd_obj: BTreeMap<c_int, usize>,
    /// The reference's steps (the other sides replay its decisions and compare with it).
    reference: Option<&'a Run>,
    progress: &'a AtomicUsize,
    /// Making a deferred operation: its probe of the queue waits for the helper.
    deferring: bool,
}

impl<'a> Env<'a> {
    pub fn new(c: &'a Calls, reference: Option<&'a Run>, progress: &'a AtomicUsize) -> Self {
        Env {
            c,
            handles: Vec::new(),
            objs: Vec::new(),
            fd_obj: BTreeMap::new(),
            reference,
            progress,
            deferring: false,
        }
    }

    /// Runs `prog` on this side: sets up its pairs, makes its operations, closes what is
    /// left.
    pub fn run(mut self, prog: &Program) -> Run {
        fds::prepare();
        let mut run = Run::default();
        for spec in &prog.pairs {
            self.make_pair(spec);
        }
        self.settle();
        for (i, op) in prog.ops.iter().enumerate() {
            self.progress.store(i, Ordering::Relaxed);
            let step = match self.reference {
                None => match self.gate(op) {
                    Ok(()) => Step::Done(self.op(i, op)),
                    Err(why) => Step::Skipped(why),
                },
                Some(r) => match &r.steps[i] {
                    Step::Skipped(why) => Step::Skipped(why),
                    Step::Done(_) => Step::Done(self.op(i, op)),
                },
            };
            self.settle();
            let differs = self.reference.is_some_and(|r| r.steps[i] != step);
            run.steps.push(step);
            if differs {
                run.diverged = Some(i);
                break;
            }
        }
        self.progress.store(usize::MAX, Ordering::Relaxed);
        if run.diverged.is_none() {
            run.digest = self.digest();
        }
        fds::cleanup(self.c.close);
        run
    }

    fn resolve(&self, r: FdRef) -> c_int {
        match r {
            FdRef::Handle(k) if !self.handles.is_empty() => {
                self.handles[k as usize % self.handles.len()]
            }
            FdRef::Handle(_) | FdRef::Unused => UNUSED,
            FdRef::High(i) => fds::high() + c_int::from(i) % HIGHS,
            FdRef::Negative => -1,
        }
    }

    /// A number a call makes a new descriptor at (`dup2`'s target, `F_DUPFD`'s minimum):
    /// inside the program's range, or refused by the kernel.
    fn resolve_target(&self, r: FdRef) -> c_int {
        match r {
            FdRef::Unused => c_int::MAX,
            r => self.resolve(r),
        }
    }

    fn obj(&self, fd: c_int) -> Option<usize> {
        self.fd_obj.get(&fd).copied()
    }

    fn open_fd_of(&self, o: usize) -> Option<c_int> {
        self.fd_obj.iter().find(|(_, &v)| v == o).map(|(&k, _)| k)
    }

    fn fd_count(&self, o: usize) -> usize {
        self.fd_obj.values().filter(|&&v| v == o).count()
    }

    fn new_obj(&mut self, fd: c_int, kind: Kind, end: u8) {
        // SAFETY: an all-zero stat is valid; fstat fills it.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: a live stat buffer.
        assert_eq!(unsafe { libc::fstat(fd, &mut st) }, 0, "harness: fstat");
        let acc = fds::fcntl(fd, libc::F_GETFL, 0) & libc::O_ACCMODE;
        self.objs.push(Obj {
            kind,
            end,
            in_flight: 0,
            rd_shut: false,
            wr_shut: false,
            packet: false,
            ident: (st.st_dev, st.st_ino, acc),
        });
        self.fd_obj.insert(fd, self.objs.len() - 1);
        self.handles.push(fd);
    }

    /// Makes a pair with this side's calls; a failure is the harness's.
    fn make_pair(&mut self, spec: &PairSpec) -> (c_int, c_int) {
        let c = self.c;
        let nb = |on: bool, flag: c_int| if on { flag } else { 0 };
        let mut fds = [-1; 2];
        // SAFETY: plain calls with live arguments; the fds they make are the program's.
        unsafe {
            match spec.kind {
                Kind::Pipe => {
                    let r = (c.pipe2)(fds.as_mut_ptr(), nb(spec.nonblock[0], libc::O_NONBLOCK));
                    assert_eq!(r, 0, "harness: pipe2: {}", errno());
                }
                Kind::UnixStream | Kind::UnixDgram | Kind::UnixSeqpacket => {
                    let ty = match spec.kind {
                        Kind::UnixStream => libc::SOCK_STREAM,
                        Kind::UnixDgram => libc::SOCK_DGRAM,
                        _ => libc::SOCK_SEQPACKET,
                    };
                    let r = (c.socketpair)(
                        libc::AF_UNIX,
                        ty | nb(spec.nonblock[0], libc::SOCK_NONBLOCK),
                        0,
                        fds.as_mut_ptr(),
                    );
                    assert_eq!(r, 0, "harness: socketpair: {}", errno());
                }
                Kind::Tcp => fds = self.tcp_pair(spec),
            }
        }
        for (end, &fd) in fds.iter().enumerate() {
            self.new_obj(fd, spec.kind, end as u8);
            if spec.kind != Kind::Pipe && spec.rcvtimeo[end] > 0 {
                fds::set_timeout(fd, libc::SO_RCVTIMEO, u32::from(spec.rcvtimeo[end]));
            }
        }
        (fds[0], fds[1])
    }

    /// A loopback TCP connection: the connected end, then the accepted one.
    ///
    /// # Safety
    /// Plain socket calls; the listener is closed before returning.
    unsafe fn tcp_pair(&self, spec: &PairSpec) -> [c_int; 2] {
        let c = self.c;
        // SAFETY: the caller's; every pointer below is to a live local.
        unsafe {
            let l = (c.socket)(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
            assert!(l >= 0, "harness: socket: {}", errno());
            let mut a: libc::sockaddr_in = std::mem::zeroed();
            a.sin_family = libc::AF_INET as libc::sa_family_t;
            a.sin_addr.s_addr = u32::from_ne_bytes([127, 0, 0, 1]);
            let alen = size_of::<libc::sockaddr_in>() as libc::socklen_t;
            let ap = (&raw mut a).cast::<libc::sockaddr>();
            assert_eq!(libc::bind(l, ap, alen), 0, "harness: bind: {}", errno());
            assert_eq!(libc::listen(l, 1), 0, "harness: listen");
            let mut len = alen;
            assert_eq!(
                libc::getsockname(l, ap, &mut len),
                0,
                "harness: getsockname"
            );
            let flags = if spec.nonblock[0] {
                libc::SOCK_NONBLOCK
            } else {
                0
            };
            let s = (c.socket)(libc::AF_INET, libc::SOCK_STREAM | flags, 0);
            assert!(s >= 0, "harness: socket: {}", errno());
            if (c.connect)(s, ap, alen) != 0 {
                assert_eq!(errno(), libc::EINPROGRESS, "harness: connect");
                assert!(
                    fds::wait_for(|| fds::ready(s, libc::POLLOUT) != 0),
                    "harness: connect hangs"
                );
                assert_eq!(
                    fds::sockopt(s, libc::SOL_SOCKET, libc::SO_ERROR),
                    0,
                    "harness: connect failed"
                );
            }
            let flags = if spec.nonblock[1] {
                libc::SOCK_NONBLOCK
            } else {
                0
            };
            let t = (c.accept4)(l, std::ptr::null_mut(), std::ptr::null_mut(), flags);
            assert!(t >= 0, "harness: accept4: {}", errno());
            assert_eq!((c.close)(l), 0, "harness: close listener");
            for fd in [s, t] {
                fds::set_sockopt(fd, libc::IPPROTO_TCP, libc::TCP_NODELAY, 1);
            }
            [s, t]
        }
    }

    /// Waits until TCP on loopback has delivered everything sent (data, FIN, RST): what
    /// the next operation sees then does not depend on timing.
    fn settle(&self) {
        for (o, obj) in self.objs.iter().enumerate() {
            if obj.kind != Kind::Tcp {
                continue;
            }
            let ok = match (self.open_fd_of(o), self.open_fd_of(o ^ 1)) {
                // Everything sent was acknowledged, or a reset ended the connection (what
                // was not acknowledged then stays counted).
                (Some(fd), _) => fds::wait_for(|| fds::outq(fd) <= 0 || fds::tcp_state(fd) == 7),
                (None, Some(peer)) if obj.in_flight == 0 => fds::wait_for(|| {
                    fds::ready(peer, libc::POLLRDHUP)
                        & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR)
                        != 0
                }),
                _ => true,
            };
            assert!(ok, "harness: TCP on loopback did not settle");
        }
    }

    /// What the kernel holds at the end: each open fd's flags (the user's view through
    /// this side's `fcntl`, and the rest as the kernel has them) and every object's queued
    /// data, drained.
    fn digest(&mut self) -> Vec<Outcome> {
        let mut out = Vec::new();
        for fd in fds::base()..fds::end() {
            if !fds::is_open(fd) {
                continue;
            }
            // SAFETY: F_GETFL takes no argument.
            let user = unsafe { (self.c.fcntl)(fd, libc::F_GETFL) };
            let mut o = outcome(i64::from(fd));
            o.extra = vec![
                i64::from(user),
                i64::from(fds::fcntl(fd, libc::F_GETFL, 0) & !libc::O_NONBLOCK),
                i64::from(fds::fcntl(fd, libc::F_GETFD, 0)),
                i64::from(fds::queued(fd)),
            ];
            out.push(o);
        }
        for o in 0..self.objs.len() {
            let Some(fd) = self.open_fd_of(o) else {
                continue;
            };
            if self.objs[o].kind == Kind::Pipe && self.objs[o].end == 1 {
                continue;
            }
            let mut d = outcome(o as i64);
            d.extra.push(i64::from(fds::sockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_ERROR,
            )));
            d.data = drain(fd, self.objs[o].kind, usize::MAX, &mut d.extra);
            out.push(d);
        }
        out
    }
}

/// Reads what is queued on `fd` without waiting (at most `limit` bytes), with raw calls;
/// the length of each piece goes to `sizes`.
fn drain(fd: c_int, kind: Kind, limit: usize, sizes: &mut Vec<i64>) -> Vec<u8> {
    let mut all = Vec::new();
    let mut buf = vec![0u8; 65536];
    while all.len() < limit {
        let want = buf.len().min(limit - all.len());
        let r = if kind == Kind::Pipe {
            let q = fds::queued(fd);
            if q <= 0 {
                break;
            }
            // SAFETY: a live buffer; at most what is queued, so a blocking pipe never waits.
            unsafe { libc::syscall(libc::SYS_read, fd, buf.as_mut_ptr(), want.min(q as usize)) }
        } else {
            // SAFETY: a live buffer; MSG_DONTWAIT never waits.
            unsafe {
                libc::syscall(
                    libc::SYS_recvfrom,
                    fd,
                    buf.as_mut_ptr(),
                    want,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut::<libc::sockaddr>(),
                    std::ptr::null_mut::<libc::socklen_t>(),
                )
            }
        };
        if r <= 0 {
            if r < 0 {
                sizes.push(-i64::from(errno()));
            }
            break;
        }
        sizes.push(r as i64);
        all.extend_from_slice(&buf[..r as usize]);
        if kind != Kind::Pipe && kind != Kind::UnixStream && kind != Kind::Tcp && r == 0 {
            break;
        }
    }
    all
}

mod ops;
