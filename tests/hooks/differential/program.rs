//! What a run does: the descriptors it starts with and the operations it makes, decoded
//! from the fuzzer's bytes. Any bytes decode to a program (missing bytes read as 0); each
//! target draws from its own family of operations.

use libc::c_int;

/// A fuzz target: which family of calls its programs make.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// `poll`, `ppoll` and `select`, with data, shutdowns and closes that make fds ready.
    PollSelect,
    /// `readv`, `writev`, `recvmsg`, `sendmsg` (and the plain forms) with iovec splits and
    /// flags.
    Vectored,
    /// `F_GETFL`/`F_SETFL`, `FIONBIO`, and reads and writes that then fail or succeed.
    FdModes,
    /// `dup`, `dup2`, `dup3`, `F_DUPFD`, `close`, and the use of the copies and closed numbers.
    DupClose,
}

impl Target {
    /// Every target, by its name in `fuzz/fuzz_targets/` and `fuzz/corpus/`.
    pub const ALL: [(&'static str, Target); 4] = [
        ("poll_select", Target::PollSelect),
        ("vectored", Target::Vectored),
        ("fd_modes", Target::FdModes),
        ("dup_close", Target::DupClose),
    ];
}

/// The kind of a pair of connected descriptors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `pipe2`: end 0 reads, end 1 writes.
    Pipe,
    UnixStream,
    UnixDgram,
    UnixSeqpacket,
    /// A loopback connection: end 0 connected, end 1 accepted.
    Tcp,
}

/// How a pair is made.
#[derive(Clone, Copy, Debug)]
pub struct PairSpec {
    pub kind: Kind,
    /// Made non-blocking (`SOCK_NONBLOCK`, `O_NONBLOCK`), per end.
    pub nonblock: [bool; 2],
    /// `SO_RCVTIMEO` in milliseconds per end (0: none; sockets only).
    pub rcvtimeo: [u8; 2],
}

/// Which descriptor number an operation names.
#[derive(Clone, Copy, Debug)]
pub enum FdRef {
    /// The number of the n-th descriptor the program made (modulo how many it made), open
    /// or closed since.
    Handle(u8),
    /// [`super::fds::high`] plus this.
    High(u8),
    /// -1.
    Negative,
    /// A number never open ([`super::fds::UNUSED`]).
    Unused,
}

/// A buffer list: lengths, or a malformed list.
#[derive(Clone, Debug)]
pub enum Iov {
    /// Buffers of these lengths.
    Lens(Vec<u16>),
    /// These lengths, with buffer `.1` (modulo their count) at an unmapped address.
    BadBase(Vec<u16>, u8),
    /// The array itself at an unmapped address (count `.0`).
    BadArray(u8),
    /// A negative count (the vectored calls) or too many buffers (past `IOV_MAX`).
    BadCount(bool),
}

/// How a plain read or write is made.
#[derive(Clone, Copy, Debug)]
pub enum Plain {
    /// `read`/`write`.
    Rw,
    /// `recv`/`send` with flags.
    Sock(c_int),
    /// `recvfrom` (asking for the address)/`sendto` (no address) with flags.
    SockTo(c_int),
    /// `read`/`write` with an unmapped buffer.
    Bad,
}

/// A timeout for `poll`, `ppoll` or `select`.
#[derive(Clone, Copy, Debug)]
pub enum Timeout {
    /// None: wait for ever (`poll`: -1; `ppoll`/`select`: null).
    Forever,
    /// Milliseconds (0 included).
    Ms(u8),
    /// `poll`: a negative timeout other than -1; `ppoll`/`select`: an invalid one (too many
    /// nanoseconds or microseconds) or, with `true`, a negative one.
    Invalid(bool),
    /// Long enough that only readiness ends the call (a helper makes an fd ready).
    Long,
}

/// `FIONBIO`'s argument.
#[derive(Clone, Copy, Debug)]
pub enum Fion {
    /// A pointer to this int.
    Value(c_int),
    /// A null pointer.
    Null,
    /// An unmapped address.
    Bad,
}

/// What a helper thread does while the operation it goes with waits. Its effect on the
/// operation's result does not depend on when it acts.
#[derive(Clone, Copy, Debug)]
pub enum Helper {
    /// Writes this many bytes (at least 1) into the peer of the operation's descriptor (a
    /// poll: the peer of its entry `.1`).
    Feed(u16, u8),
    /// Reads from the peer everything queued there plus what the write sends.
    Drain,
}

/// One operation.
#[derive(Clone, Debug)]
pub enum Op {
    Write {
        fd: FdRef,
        len: u16,
        how: Plain,
    },
    Read {
        fd: FdRef,
        len: u16,
        how: Plain,
    },
    Writev {
        fd: FdRef,
        iov: Iov,
    },
    Readv {
        fd: FdRef,
        iov: Iov,
    },
    /// `sendmsg`; `pass`: an `SCM_RIGHTS` message with this descriptor; `name`: an address
    /// nobody is bound to.
    Sendmsg {
        fd: FdRef,
        iov: Iov,
        flags: c_int,
        pass: Option<FdRef>,
        name: bool,
    },
    /// `recvmsg`; `control`: the control buffer's length (0: none); `name`: ask for the
    /// address.
    Recvmsg {
        fd: FdRef,
        iov: Iov,
        flags: c_int,
        control: u8,
        name: bool,
    },
    /// One byte of urgent data (`MSG_OOB`).
    Oob {
        fd: FdRef,
    },
    Poll {
        fds: Vec<(FdRef, i16)>,
        timeout: Timeout,
    },
    /// `ppoll`, with an empty signal mask if `mask`.
    Ppoll {
        fds: Vec<(FdRef, i16)>,
        timeout: Timeout,
        mask: bool,
    },
    /// `select` with `n` (`None`: the highest fd in the sets plus one; else this, which may
    /// be past `FD_SETSIZE`) and the sets (`None`: a null set).
    Select {
        n: Option<c_int>,
        sets: [Option<Vec<FdRef>>; 3],
        timeout: Timeout,
    },
    GetFl {
        fd: FdRef,
    },
    SetFl {
        fd: FdRef,
        flags: c_int,
    },
    Fionbio {
        fd: FdRef,
        arg: Fion,
    },
    Dup {
        fd: FdRef,
    },
    Dup2 {
        fd: FdRef,
        to: FdRef,
    },
    Dup3 {
        fd: FdRef,
        to: FdRef,
        flags: c_int,
    },
    /// `fcntl(F_DUPFD or F_DUPFD_CLOEXEC, min)`.
    DupFd {
        fd: FdRef,
        min: FdRef,
        cloexec: bool,
    },
    Close {
        fd: FdRef,
    },
    Shutdown {
        fd: FdRef,
        how: c_int,
    },
    /// Makes a new pair (its numbers: the lowest free, as the kernel hands them out).
    NewPair(PairSpec),
    /// The operation, while a helper thread does its part after `delay` milliseconds.
    Deferred {
        op: Box<Op>,
        helper: Helper,
        delay: u8,
    },
}

/// A program: its pairs, then its operations.
#[derive(Clone, Debug)]
pub struct Program {
    pub pairs: Vec<PairSpec>,
    pub ops: Vec<Op>,
}

/// At most this many operations a program.
pub const MAX_OPS: usize = 24;

/// Reads the fuzzer's bytes; past the end every read is 0.
pub struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Reader { data, pos: 0 }
    }

    pub fn done(&self) -> bool {
        self.pos >= self.data.len()
    }

    pub fn u8(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }

    pub fn u16(&mut self) -> u16 {
        u16::from(self.u8()) | u16::from(self.u8()) << 8
    }

    /// A number below `n` (`n` at most 256).
    pub fn below(&mut self, n: u32) -> u32 {
        u32::from(self.u8()) % n
    }

    pub fn bool(&mut self) -> bool {
        self.u8() & 1 != 0
    }

    /// True one time in `n`.
    pub fn one_in(&mut self, n: u32) -> bool {
        self.below(n) == 0
    }
}

impl Program {
    /// The program `data` describes for `target`.
    pub fn decode(target: Target, data: &[u8]) -> Program {
        let mut r = Reader::new(data);
        let npairs = 1 + r.below(3) as usize;
        let pairs = (0..npairs).map(|_| pair(&mut r, target)).collect();
        let mut ops = Vec::new();
        while !r.done() && ops.len() < MAX_OPS {
            ops.push(match target {
                Target::PollSelect => poll_op(&mut r),
                Target::Vectored => vectored_op(&mut r),
                Target::FdModes => mode_op(&mut r),
                Target::DupClose => dup_op(&mut r),
            });
        }
        Program { pairs, ops }
    }
}

fn pair(r: &mut Reader, target: Target) -> PairSpec {
    let kinds: &[Kind] = match target {
        // Urgent data (select's exception set, POLLPRI) needs TCP.
        Target::PollSelect => &[
            Kind::Pipe,
            Kind::UnixStream,
            Kind::UnixDgram,
            Kind::Tcp,
            Kind::UnixSeqpacket,
        ],
        _ => &[
            Kind::UnixStream,
            Kind::Pipe,
            Kind::UnixDgram,
            Kind::UnixSeqpacket,
            Kind::Tcp,
        ],
    };
    let kind = kinds[r.below(kinds.len() as u32) as usize];
    let bits = r.u8();
    let rcv = r.u8();
    PairSpec {
        kind,
        nonblock: [bits & 1 != 0, bits & 2 != 0],
        rcvtimeo: [rcv % 3, (rcv / 3) % 3],
    }
}

fn fd_ref(r: &mut Reader) -> FdRef {
    let b = r.u8();
    match b {
        0..=235 => FdRef::Handle(b),
        236..=249 => FdRef::High(b % 4),
        250..=252 => FdRef::Negative,
        _ => FdRef::Unused,
    }
}

/// A length: mostly small, sometimes across a page or a pipe's capacity.
fn len(r: &mut Reader) -> u16 {
    match r.below(8) {
        0 => 0,
        1..=4 => 1 + r.below(64) as u16,
        5 | 6 => r.u16() % 4097,
        _ => r.u16() % 20000,
    }
}

fn iov(r: &mut Reader) -> Iov {
    let lens = |r: &mut Reader| {
        let n = r.below(6) as usize;
        (0..n)
            .map(|_| {
                if r.one_in(4) {
                    0
                } else {
                    1 + r.below(40) as u16 * if r.one_in(6) { 100 } else { 1 }
                }
            })
            .collect::<Vec<_>>()
    };
    match r.below(24) {
        0 => Iov::BadBase(lens(r), r.u8()),
        1 => Iov::BadArray(1 + r.below(3) as u8),
        2 => Iov::BadCount(r.bool()),
        _ => Iov::Lens(lens(r)),
    }
}

fn plain(r: &mut Reader, recv: bool) -> Plain {
    match r.below(10) {
        0 => Plain::Bad,
        1..=3 => Plain::Rw,
        4..=6 => Plain::Sock(flags(r, recv)),
        _ => Plain::SockTo(flags(r, recv)),
    }
}

/// Socket flags for a receive or a send.
fn flags(r: &mut Reader, recv: bool) -> c_int {
    let bits = r.u8();
    let menu: &[c_int] = if recv {
        &[
            libc::MSG_PEEK,
            libc::MSG_DONTWAIT,
            libc::MSG_WAITALL,
            libc::MSG_TRUNC,
            libc::MSG_CMSG_CLOEXEC,
            libc::MSG_ERRQUEUE,
        ]
    } else {
        &[
            libc::MSG_DONTWAIT,
            libc::MSG_NOSIGNAL,
            libc::MSG_EOR,
            libc::MSG_DONTROUTE,
        ]
    };
    let mut f = 0;
    for (i, m) in menu.iter().enumerate() {
        // The rarer flags (errqueue, EOR, DONTROUTE) one time in four.
        let rare = i >= 4 && bits & 0x80 == 0;
        if bits & (1 << i) != 0 && !rare {
            f |= m;
        }
    }
    f
}

fn events(r: &mut Reader) -> i16 {
    let b = r.u8();
    if b == 255 {
        return r.u16() as i16;
    }
    let menu = [
        libc::POLLIN,
        libc::POLLOUT,
        libc::POLLPRI,
        libc::POLLRDHUP,
        libc::POLLRDNORM,
        libc::POLLWRNORM,
        libc::POLLRDBAND,
        libc::POLLWRBAND,
    ];
    menu.iter()
        .enumerate()
        .filter(|(i, _)| b & (1 << i) != 0)
        .fold(0, |e, (_, m)| e | m)
}

fn timeout(r: &mut Reader) -> Timeout {
    match r.below(12) {
        0..=3 => Timeout::Ms(0),
        4..=6 => Timeout::Ms(1 + r.below(3) as u8),
        7 | 8 => Timeout::Forever,
        9 => Timeout::Invalid(r.bool()),
        _ => Timeout::Long,
    }
}

fn poll_fds(r: &mut Reader) -> Vec<(FdRef, i16)> {
    let n = r.below(6) as usize;
    (0..n).map(|_| (fd_ref(r), events(r))).collect()
}

fn select_op(r: &mut Reader) -> Op {
    let set = |r: &mut Reader| {
        if r.one_in(4) {
            None
        } else {
            let n = r.below(4) as usize;
            Some((0..n).map(|_| fd_ref(r)).collect())
        }
    };
    let n = match r.below(8) {
        0 => Some(r.u16() as c_int % 1100),
        1 => Some(-1),
        _ => None,
    };
    Op::Select {
        n,
        sets: [set(r), set(r), set(r)],
        timeout: timeout(r),
    }
}

/// A write that makes data (or urgent data) ready for the poll that follows.
fn feed_op(r: &mut Reader) -> Op {
    Op::Write {
        fd: fd_ref(r),
        len: 1 + r.below(200) as u16,
        how: Plain::Rw,
    }
}

fn poll_op(r: &mut Reader) -> Op {
    match r.below(20) {
        0..=3 => feed_op(r),
        4 => Op::Read {
            fd: fd_ref(r),
            len: len(r),
            how: plain(r, true),
        },
        5 => Op::Shutdown {
            fd: fd_ref(r),
            how: r.below(3) as c_int,
        },
        6 => Op::Close { fd: fd_ref(r) },
        7 => Op::Oob { fd: fd_ref(r) },
        8 | 9 => Op::Poll {
            fds: poll_fds(r),
            timeout: timeout(r),
        },
        10 | 11 => Op::Ppoll {
            fds: poll_fds(r),
            timeout: timeout(r),
            mask: r.one_in(4),
        },
        12..=14 => select_op(r),
        15 => Op::Dup { fd: fd_ref(r) },
        _ => {
            let op = match r.below(3) {
                0 => Op::Poll {
                    fds: poll_fds(r),
                    timeout: Timeout::Forever,
                },
                1 => Op::Ppoll {
                    fds: poll_fds(r),
                    timeout: Timeout::Long,
                    mask: false,
                },
                _ => match select_op(r) {
                    Op::Select { n, sets, .. } => Op::Select {
                        n,
                        sets,
                        timeout: Timeout::Long,
                    },
                    _ => unreachable!(),
                },
            };
            Op::Deferred {
                op: Box::new(op),
                helper: Helper::Feed(1 + r.below(3) as u16, r.u8()),
                delay: r.below(3) as u8,
            }
        }
    }
}

fn vectored_op(r: &mut Reader) -> Op {
    match r.below(20) {
        0..=2 => Op::Writev {
            fd: fd_ref(r),
            iov: iov(r),
        },
        3..=5 => Op::Readv {
            fd: fd_ref(r),
            iov: iov(r),
        },
        6..=8 => Op::Sendmsg {
            fd: fd_ref(r),
            iov: iov(r),
            flags: flags(r, false),
            pass: r.one_in(4).then(|| fd_ref(r)),
            name: r.one_in(8),
        },
        9..=11 => Op::Recvmsg {
            fd: fd_ref(r),
            iov: iov(r),
            flags: flags(r, true),
            control: [0, 0, 24, 8, 64][r.below(5) as usize],
            name: r.one_in(4),
        },
        12 => Op::Write {
            fd: fd_ref(r),
            len: len(r),
            how: plain(r, false),
        },
        13 => Op::Read {
            fd: fd_ref(r),
            len: len(r),
            how: plain(r, true),
        },
        14 => Op::Shutdown {
            fd: fd_ref(r),
            how: r.below(3) as c_int,
        },
        15 => Op::Close { fd: fd_ref(r) },
        _ => deferred_io(r),
    }
}

/// A blocking receive that a helper's data completes, or a blocking send that a helper's
/// reading lets through.
fn deferred_io(r: &mut Reader) -> Op {
    let fd = fd_ref(r);
    let (op, helper) = match r.below(6) {
        0 => (
            Op::Readv { fd, iov: iov(r) },
            Helper::Feed(1 + r.below(64) as u16 * 64, 0),
        ),
        1 => (
            Op::Read {
                fd,
                len: len(r),
                how: Plain::Rw,
            },
            Helper::Feed(1 + r.u16() % 8000, 0),
        ),
        2 => {
            let flags = libc::MSG_WAITALL | if r.one_in(3) { libc::MSG_PEEK } else { 0 };
            (
                Op::Recvmsg {
                    fd,
                    iov: iov(r),
                    flags,
                    control: [0, 24][r.below(2) as usize],
                    name: false,
                },
                Helper::Feed(1 + r.u16() % 8000, 0),
            )
        }
        3 => {
            let lens = (0..1 + r.below(4)).map(|_| r.u16() % 50000).collect();
            (
                Op::Writev {
                    fd,
                    iov: Iov::Lens(lens),
                },
                Helper::Drain,
            )
        }
        4 => {
            let lens = (0..1 + r.below(4)).map(|_| r.u16() % 50000).collect();
            (
                Op::Sendmsg {
                    fd,
                    iov: Iov::Lens(lens),
                    flags: 0,
                    pass: None,
                    name: false,
                },
                Helper::Drain,
            )
        }
        _ => (
            Op::Write {
                fd,
                len: r.u16(),
                how: Plain::Rw,
            },
            Helper::Drain,
        ),
    };
    Op::Deferred {
        op: Box::new(op),
        helper,
        delay: r.below(3) as u8,
    }
}

fn setfl_flags(r: &mut Reader) -> c_int {
    match r.below(8) {
        0..=2 => libc::O_NONBLOCK,
        3 | 4 => 0,
        5 => libc::O_NONBLOCK | libc::O_APPEND,
        6 => libc::O_APPEND,
        // O_DIRECT: sockets refuse it (EINVAL), pipes take it (packet mode).
        _ => libc::O_DIRECT | if r.bool() { libc::O_NONBLOCK } else { 0 },
    }
}

fn fion(r: &mut Reader) -> Fion {
    match r.below(10) {
        0 => Fion::Null,
        1 => Fion::Bad,
        2 => Fion::Value(r.u8() as c_int - 128),
        3..=5 => Fion::Value(0),
        _ => Fion::Value(1),
    }
}

fn mode_op(r: &mut Reader) -> Op {
    match r.below(22) {
        0..=3 => Op::GetFl { fd: fd_ref(r) },
        4..=6 => Op::SetFl {
            fd: fd_ref(r),
            flags: setfl_flags(r),
        },
        7 | 8 => Op::Fionbio {
            fd: fd_ref(r),
            arg: fion(r),
        },
        9 | 10 => Op::Write {
            fd: fd_ref(r),
            len: len(r),
            how: plain(r, false),
        },
        11 | 12 => Op::Read {
            fd: fd_ref(r),
            len: len(r),
            how: plain(r, true),
        },
        13 => Op::Dup { fd: fd_ref(r) },
        14 => Op::Close { fd: fd_ref(r) },
        15 => Op::Sendmsg {
            fd: fd_ref(r),
            iov: Iov::Lens(vec![1]),
            flags: 0,
            pass: Some(fd_ref(r)),
            name: false,
        },
        16 => Op::Recvmsg {
            fd: fd_ref(r),
            iov: Iov::Lens(vec![1 + r.below(4) as u16]),
            flags: 0,
            control: 24,
            name: false,
        },
        17 => Op::Poll {
            fds: poll_fds(r),
            timeout: Timeout::Ms(r.below(2) as u8),
        },
        _ => {
            let fd = fd_ref(r);
            let (op, helper) = if r.bool() {
                (
                    Op::Read {
                        fd,
                        len: len(r),
                        how: Plain::Rw,
                    },
                    Helper::Feed(1 + r.below(100) as u16, 0),
                )
            } else {
                (
                    Op::Write {
                        fd,
                        len: r.u16(),
                        how: Plain::Rw,
                    },
                    Helper::Drain,
                )
            };
            Op::Deferred {
                op: Box::new(op),
                helper,
                delay: r.below(3) as u8,
            }
        }
    }
}

fn dup_op(r: &mut Reader) -> Op {
    match r.below(24) {
        0..=2 => Op::Dup { fd: fd_ref(r) },
        3 | 4 => Op::Dup2 {
            fd: fd_ref(r),
            to: fd_ref(r),
        },
        5 | 6 => Op::Dup3 {
            fd: fd_ref(r),
            to: fd_ref(r),
            flags: [0, libc::O_CLOEXEC, libc::O_NONBLOCK][r.below(3) as usize],
        },
        7 => Op::DupFd {
            fd: fd_ref(r),
            min: fd_ref(r),
            cloexec: r.bool(),
        },
        8..=10 => Op::Close { fd: fd_ref(r) },
        11 => Op::NewPair(pair(r, Target::DupClose)),
        12 | 13 => Op::Write {
            fd: fd_ref(r),
            len: len(r),
            how: plain(r, false),
        },
        14 | 15 => Op::Read {
            fd: fd_ref(r),
            len: len(r),
            how: plain(r, true),
        },
        16 => Op::GetFl { fd: fd_ref(r) },
        17 => Op::SetFl {
            fd: fd_ref(r),
            flags: setfl_flags(r),
        },
        18 => Op::Fionbio {
            fd: fd_ref(r),
            arg: fion(r),
        },
        19 => Op::Poll {
            fds: poll_fds(r),
            timeout: Timeout::Ms(0),
        },
        20 => Op::Shutdown {
            fd: fd_ref(r),
            how: r.below(3) as c_int,
        },
        _ => {
            let fd = fd_ref(r);
            Op::Deferred {
                op: Box::new(Op::Read {
                    fd,
                    len: len(r),
                    how: Plain::Rw,
                }),
                helper: Helper::Feed(1 + r.below(100) as u16, 0),
                delay: r.below(3) as u8,
            }
        }
    }
}
