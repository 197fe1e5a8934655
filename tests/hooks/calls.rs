#![cfg(feature = "hook")]
//! The hooked calls one by one: `poll`/`ppoll`/`select` (their flags, odd arguments, fds past
//! `FD_SETSIZE`, read-only sets), `connect`/`accept4` (timeouts, full backlogs, refusals),
//! the sleeps, `getaddrinfo` cancelled while it resolves, `hook::without`, and the
//! `_FORTIFY_SOURCE` forms, which abort on an overflow as glibc's do. Each compares what a
//! hooked call does in a fiber with what libc's own call does on a plain thread; a call that
//! may hang, kill the process or leave threads behind runs in a child process.
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{
    both, child_ok, errno, finish, in_child, same_as_libc, started, with_deadline,
};

fn pfd(fd: RawFd, events: i16) -> libc::pollfd {
    libc::pollfd {
        fd,
        events,
        revents: 0,
    }
}

/// A thread that runs `f` after `ms` milliseconds.
fn later(ms: u64, f: impl FnOnce() + Send + 'static) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(ms));
        f()
    })
}

// ---------------------------------------------------------------------------------------
// poll: POLLRDNORM / POLLWRNORM / POLLRDBAND interests
// ---------------------------------------------------------------------------------------

/// poll for POLLRDNORM only (no POLLIN) on a socket that gets data 100 ms later.
fn poll_rdnorm_later() -> (i32, i16, bool) {
    let (a, b) = UnixStream::pair().unwrap();
    let w = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        (&b).write_all(b"x").unwrap();
        b
    });
    poll_until_the_peer_acts(&a, libc::POLLRDNORM, w)
}

/// Polls `a` for `events` (3 s at most) while the thread `peer` acts on the other end 100 ms
/// in: the result, the revents, and whether the poll ended long before its timeout.
fn poll_until_the_peer_acts(
    a: &UnixStream,
    events: i16,
    peer: std::thread::JoinHandle<UnixStream>,
) -> (i32, i16, bool) {
    let mut p = [pfd(a.as_raw_fd(), events)];
    let t = Instant::now();
    // SAFETY: live pollfds.
    let r = unsafe { libc::poll(p.as_mut_ptr(), 1, 3000) };
    let took = t.elapsed();
    drop(peer.join().unwrap());
    (r, p[0].revents, took < Duration::from_millis(1500))
}

#[test]
fn poll_for_pollrdnorm_wakes_when_data_comes() {
    with_deadline(|| {
        same_as_libc(
            poll_rdnorm_later,
            (1, libc::POLLRDNORM, true),
            "POLLRDNORM-only poll",
        )
    });
}

/// poll for POLLWRNORM only on a socket whose send buffer is full, drained 100 ms later.
fn poll_wrnorm_later() -> (i32, i16, bool) {
    let (a, b) = UnixStream::pair().unwrap();
    let chunk = [0u8; 4096];
    // Fill a's buffer without waiting.
    loop {
        // SAFETY: a live buffer.
        let r = unsafe {
            libc::send(
                a.as_raw_fd(),
                chunk.as_ptr().cast(),
                chunk.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if r < 0 {
            assert_eq!(errno(), libc::EAGAIN);
            break;
        }
    }
    let w = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        let mut buf = vec![0u8; 1 << 16];
        b.set_nonblocking(true).unwrap();
        while let Ok(n) = (&b).read(&mut buf) {
            if n == 0 {
                break;
            }
        }
        b
    });
    poll_until_the_peer_acts(&a, libc::POLLWRNORM, w)
}

#[test]
fn poll_for_pollwrnorm_wakes_when_room_comes() {
    with_deadline(|| {
        same_as_libc(
            poll_wrnorm_later,
            (1, libc::POLLWRNORM, true),
            "POLLWRNORM-only poll",
        )
    });
}

// ---------------------------------------------------------------------------------------
// poll: bad pointers
// ---------------------------------------------------------------------------------------

fn poll_null_array() -> Vec<(i32, i32, bool)> {
    let mut out = Vec::new();
    let t = Instant::now();
    // SAFETY: a null array: the kernel refuses it with EFAULT.
    let r = unsafe { libc::poll(std::ptr::null_mut(), 1, 300) };
    out.push((
        r,
        if r < 0 { errno() } else { 0 },
        t.elapsed() < Duration::from_millis(250),
    ));
    let ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 300_000_000,
    };
    let t = Instant::now();
    // SAFETY: as above.
    let r = unsafe { libc::ppoll(std::ptr::null_mut(), 2, &ts, std::ptr::null()) };
    out.push((
        r,
        if r < 0 { errno() } else { 0 },
        t.elapsed() < Duration::from_millis(250),
    ));
    out
}

#[test]
fn poll_with_a_null_array_fails_with_efault() {
    with_deadline(|| {
        same_as_libc(
            poll_null_array,
            vec![(-1, libc::EFAULT, true), (-1, libc::EFAULT, true)],
            "poll(NULL, n > 0)",
        )
    });
}

// ---------------------------------------------------------------------------------------
// poll: many fds, duplicates, negative fds
// ---------------------------------------------------------------------------------------

fn poll_many() -> (i32, Vec<i16>, i32, Vec<i16>) {
    let (a, b) = UnixStream::pair().unwrap();
    let (c, _d) = UnixStream::pair().unwrap();
    let mut p: Vec<libc::pollfd> = (0..1500)
        .map(|i| match i % 5 {
            0 => pfd(a.as_raw_fd(), libc::POLLIN),
            1 => pfd(-1 - i, libc::POLLIN | libc::POLLOUT),
            2 => pfd(a.as_raw_fd(), libc::POLLIN | libc::POLLOUT),
            3 => pfd(c.as_raw_fd(), libc::POLLIN),
            _ => pfd(c.as_raw_fd(), 0),
        })
        .collect();
    // Nothing readable: 1 ms passes with 0... but POLLOUT entries are ready at once.
    // SAFETY: live pollfds.
    let r1 = unsafe { libc::poll(p.as_mut_ptr(), p.len() as _, -1) };
    let rev1: Vec<i16> = p.iter().map(|p| p.revents).collect();
    // Drop the POLLOUT interest: nothing ready until b writes 50 ms later.
    for q in p.iter_mut() {
        q.events &= !libc::POLLOUT;
        q.revents = 0x7f;
    }
    let w = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        (&b).write_all(b"x").unwrap();
        b
    });
    // SAFETY: live pollfds.
    let r2 = unsafe { libc::poll(p.as_mut_ptr(), p.len() as _, i32::MAX) };
    let rev2: Vec<i16> = p.iter().map(|p| p.revents).collect();
    drop(w.join().unwrap());
    (r1, rev1, r2, rev2)
}

#[test]
fn poll_of_1500_entries_with_duplicates_and_negative_fds_matches_libc() {
    with_deadline(|| {
        let (fib, plain) = both(poll_many);
        assert_eq!(plain.0, 300);
        assert_eq!(plain.2, 600);
        let diff = |f: &[i16], p: &[i16]| {
            f.iter()
                .zip(p)
                .enumerate()
                .filter(|(_, (a, b))| a != b)
                .map(|(i, (a, b))| (i, *a, *b))
                .take(10)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            (fib.0, fib.2),
            (plain.0, plain.2),
            "counts; first revents differences (index, fiber, libc): {:?} / {:?}",
            diff(&fib.1, &plain.1),
            diff(&fib.3, &plain.3)
        );
        assert!(
            fib == plain,
            "revents differences (index, fiber, libc): first poll {:?}; second poll {:?}",
            diff(&fib.1, &plain.1),
            diff(&fib.3, &plain.3)
        );
    });
}

// ---------------------------------------------------------------------------------------
// select with fds at or above FD_SETSIZE
// ---------------------------------------------------------------------------------------

/// A pipe's read end moved to a free fd at or above 1500, in a 2048-bit fd set; select with
/// n = that fd + 1.
fn select_high_fd(write_after: Option<u64>) -> (i32, bool, Duration) {
    let mut fds = [0; 2];
    // SAFETY: a live array of two fds.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // The lowest free number from 1500 on: a fixed number (dup2) would replace the fd of a
    // test running at the same time.
    // SAFETY: our pipe's read end.
    let high = unsafe { libc::fcntl(fds[0], libc::F_DUPFD, 1500) };
    assert!((1500..2048).contains(&high), "F_DUPFD gave {high}");
    // SAFETY: our fd.
    unsafe { libc::close(fds[0]) };
    let wfd = fds[1];
    let w = write_after.map(|ms| {
        later(ms, move || {
            // SAFETY: our pipe's write end.
            unsafe { libc::write(wfd, b"x".as_ptr().cast(), 1) };
        })
    });
    let mut set = [0u64; 32];
    set[high as usize / 64] |= 1 << (high % 64);
    let mut tv = libc::timeval {
        tv_sec: 0,
        tv_usec: 400_000,
    };
    let t = Instant::now();
    // SAFETY: a 2048-bit set, enough for n = 1501; a live timeval.
    let r = unsafe {
        libc::select(
            high + 1,
            set.as_mut_ptr().cast(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            &mut tv,
        )
    };
    let took = t.elapsed();
    if let Some(w) = w {
        w.join().unwrap();
    }
    let hit = set[high as usize / 64] & (1 << (high % 64)) != 0;
    // SAFETY: our fds.
    unsafe {
        libc::close(high);
        libc::close(wfd);
    }
    (r, hit, took)
}

#[test]
fn select_above_fd_setsize_matches_libc() {
    with_deadline(|| {
        let (fib, plain) = both(|| select_high_fd(Some(100)));
        assert_eq!((plain.0, plain.1), (1, true), "libc");
        assert_eq!((fib.0, fib.1), (plain.0, plain.1), "fiber");
    });
}

#[test]
fn select_above_fd_setsize_parks_only_the_fiber() {
    with_deadline(|| {
        let s = started(1);
        let stop = Arc::new(AtomicBool::new(false));
        let (ticks, tick) = crate::common::ticker(&s, stop.clone(), Duration::from_millis(5));
        crate::common::wait_until("the ticker to tick", || ticks.load(Ordering::Relaxed) > 0);
        let before = ticks.load(Ordering::Relaxed);
        let (r, _, took) = finish(s.submit(|| select_high_fd(None), None).unwrap());
        let during = ticks.load(Ordering::Relaxed) - before;
        stop.store(true, Ordering::Relaxed);
        finish(tick);
        s.stop();
        assert_eq!(r, 0);
        assert!(took >= Duration::from_millis(390), "{took:?}");
        assert!(
            during >= 10,
            "the worker was blocked in select(1501+, …) for {took:?}: {during} ticks"
        );
    });
}

// ---------------------------------------------------------------------------------------
// connect: a second call while one is in progress
// ---------------------------------------------------------------------------------------

fn sockaddr_lo(port: u16) -> libc::sockaddr_in {
    // SAFETY: all-zero is a valid sockaddr_in.
    let mut sa: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    sa.sin_family = libc::AF_INET as _;
    sa.sin_addr.s_addr = u32::from_ne_bytes([127, 0, 0, 1]);
    sa.sin_port = port.to_be();
    sa
}

const SALEN: libc::socklen_t = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;

/// A listener with backlog 0 and one connection queued, so that the next SYN is dropped.
fn full_listener() -> (RawFd, libc::sockaddr_in, RawFd) {
    // SAFETY: plain socket calls on live buffers.
    unsafe {
        let l = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        let mut sa = sockaddr_lo(0);
        assert_eq!(
            libc::bind(l, (&sa as *const libc::sockaddr_in).cast(), SALEN),
            0
        );
        assert_eq!(libc::listen(l, 0), 0);
        let mut got = SALEN;
        libc::getsockname(l, (&mut sa as *mut libc::sockaddr_in).cast(), &mut got);
        let filler = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        assert_eq!(
            libc::connect(filler, (&sa as *const libc::sockaddr_in).cast(), SALEN),
            0
        );
        (l, sa, filler)
    }
}

fn set_sndtimeo(fd: RawFd, ms: u64) {
    crate::common::set_socket_timeout(fd, libc::SO_SNDTIMEO, Duration::from_millis(ms));
}

/// A connect that times out (EINPROGRESS), then room is made in the backlog, then a second
/// blocking connect, then a third.
fn connect_again() -> Vec<(i32, i32)> {
    let (l, sa, filler) = full_listener();
    let mut out = Vec::new();
    // SAFETY: plain socket calls on live buffers.
    unsafe {
        let c = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        set_sndtimeo(c, 150);
        let r = libc::connect(c, (&sa as *const libc::sockaddr_in).cast(), SALEN);
        out.push((r, if r < 0 { errno() } else { 0 }));
        // Make room: accept the queued connection; the SYN retransmission gets in.
        let a = libc::accept(l, std::ptr::null_mut(), std::ptr::null_mut());
        assert!(a >= 0);
        set_sndtimeo(c, 5000);
        let r = libc::connect(c, (&sa as *const libc::sockaddr_in).cast(), SALEN);
        out.push((r, if r < 0 { errno() } else { 0 }));
        let r = libc::connect(c, (&sa as *const libc::sockaddr_in).cast(), SALEN);
        out.push((r, if r < 0 { errno() } else { 0 }));
        for fd in [a, c, filler, l] {
            libc::close(fd);
        }
    }
    out
}

#[test]
fn a_second_blocking_connect_after_a_timeout_waits_as_libc() {
    with_deadline(|| {
        let (fib, plain) = both(connect_again);
        eprintln!("libc: {plain:?}\nfiber: {fib:?}");
        assert_eq!(fib, plain);
    });
}

// ---------------------------------------------------------------------------------------
// poll: revents of hang-ups, errors and bad fds, also when they come while it waits
// ---------------------------------------------------------------------------------------

fn revents_battery() -> Vec<(i32, Vec<i16>)> {
    let mut out = Vec::new();
    let mut poll = |p: &mut [libc::pollfd], t: i32| {
        // SAFETY: live pollfds.
        let r = unsafe { libc::poll(p.as_mut_ptr(), p.len() as _, t) };
        out.push((r, p.iter().map(|p| p.revents).collect::<Vec<_>>()));
    };
    // Pipes: reader gone (POLLERR on the writer), writer gone (POLLHUP on the reader).
    let mut f1 = [0; 2];
    let mut f2 = [0; 2];
    // SAFETY: live arrays.
    unsafe {
        libc::pipe(f1.as_mut_ptr());
        libc::pipe(f2.as_mut_ptr());
        libc::close(f1[0]);
        libc::close(f2[1]);
    }
    // A number never open (the limit is 20 000 here; fibra's reactor may take a number
    // freed just before the first poll).
    let closed = 19_000;
    let all = libc::POLLIN | libc::POLLOUT | libc::POLLPRI | libc::POLLRDHUP;
    poll(
        &mut [
            pfd(f1[1], libc::POLLOUT),
            pfd(f1[1], 0),
            pfd(f2[0], libc::POLLIN),
            pfd(f2[0], 0),
            pfd(closed, 0),
            pfd(closed, all),
            pfd(-7, all),
        ],
        -1,
    );
    // A socket reset by its peer.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (srv, _) = l.accept().unwrap();
    crate::common::reset(srv);
    std::thread::sleep(Duration::from_millis(20));
    poll(&mut [pfd(c.as_raw_fd(), all), pfd(c.as_raw_fd(), 0)], -1);
    // A socket whose peer shuts its writing side 50 ms later: waiting for POLLRDHUP only.
    let (a, b) = UnixStream::pair().unwrap();
    let w = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        b.shutdown(std::net::Shutdown::Write).unwrap();
        b
    });
    poll(&mut [pfd(a.as_raw_fd(), libc::POLLRDHUP)], 3000);
    let b = w.join().unwrap();
    // The peer closes 50 ms later: waiting with no events at all.
    let w = later(50, move || drop(b));
    poll(&mut [pfd(a.as_raw_fd(), 0)], 3000);
    w.join().unwrap();
    // A pipe's reader closes 50 ms later while its writer waits for POLLIN only.
    let mut f3 = [0; 2];
    // SAFETY: live array.
    unsafe { libc::pipe(f3.as_mut_ptr()) };
    let r3 = f3[0];
    let w = later(50, move || unsafe {
        // SAFETY: our fd.
        libc::close(r3);
    });
    poll(&mut [pfd(f3[1], libc::POLLIN)], 3000);
    w.join().unwrap();
    // SAFETY: our fds.
    unsafe {
        for fd in [f1[1], f2[0], f3[1]] {
            libc::close(fd);
        }
    }
    out
}

#[test]
fn poll_revents_of_hangups_errors_and_bad_fds_match_libc() {
    with_deadline(|| {
        let (fib, plain) = both(revents_battery);
        eprintln!("libc: {plain:?}");
        assert_eq!(fib, plain);
    });
}

/// poll on a socket whose fd another thread closes 100 ms later. The timeout is long, so
/// that even a close a loaded machine delays comes before it (libc's poll then waits it out:
/// 3 s). The fd is moved to a number from 900 up: libc's poll looks at the number again at
/// its timeout, and a low number freed by the close would soon be another test's fd.
fn poll_closed_meanwhile() -> (i32, i16, u128) {
    let (a, _b) = UnixStream::pair().unwrap();
    // SAFETY: F_DUPFD_CLOEXEC of a live fd; the copy is ours alone.
    let fd = unsafe { libc::fcntl(a.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 900) };
    assert!(fd >= 900, "no free fd from 900 up");
    drop(a);
    let w = later(100, move || unsafe {
        // SAFETY: our fd, no longer owned by anything.
        libc::close(fd);
    });
    let mut p = [pfd(fd, libc::POLLIN)];
    let t = Instant::now();
    // SAFETY: live pollfds.
    let r = unsafe { libc::poll(p.as_mut_ptr(), 1, 3000) };
    let took = t.elapsed().as_millis() / 300;
    w.join().unwrap();
    (r, p[0].revents, took)
}

#[test]
fn poll_on_an_fd_closed_meanwhile_matches_libc() {
    with_deadline(|| {
        let (fib, plain) = both(poll_closed_meanwhile);
        eprintln!("libc: {plain:?} fiber: {fib:?}");
        // libc's poll holds the file: it sees POLLNVAL only at its timeout; the fiber's
        // may see it as soon as the fd is closed. The result is the same.
        assert_eq!((fib.0, fib.1), (plain.0, plain.1));
    });
}

/// Short timeouts: 1 ms, and a ppoll of 1 ns, nothing ready.
fn short_timeouts() -> Vec<(i32, bool)> {
    let (a, _b) = UnixStream::pair().unwrap();
    let mut out = Vec::new();
    for _ in 0..20 {
        let mut p = [pfd(a.as_raw_fd(), libc::POLLIN)];
        let t = Instant::now();
        // SAFETY: live pollfds.
        let r = unsafe { libc::poll(p.as_mut_ptr(), 1, 1) };
        out.push((r, t.elapsed() >= Duration::from_millis(1)));
    }
    out.dedup();
    out
}

#[test]
fn poll_with_a_1_ms_timeout_waits_at_least_1_ms() {
    with_deadline(|| same_as_libc(short_timeouts, vec![(0, true)], "1 ms poll"));
}

// ---------------------------------------------------------------------------------------
// sleeps
// ---------------------------------------------------------------------------------------

fn ts(sec: i64, nsec: i64) -> libc::timespec {
    libc::timespec {
        tv_sec: sec,
        tv_nsec: nsec,
    }
}

fn sleep_battery() -> Vec<(String, i32, i32)> {
    let mut out = Vec::new();
    let sentinel = ts(77, 77);
    let mut push = |what: &str, r: i32, e: i32| out.push((what.to_string(), r, e));
    for (what, req) in [
        ("nsec -1", ts(0, -1)),
        ("nsec 1e9", ts(0, 1_000_000_000)),
        ("sec -1", ts(-1, 0)),
        ("1 ms", ts(0, 1_000_000)),
        ("zero", ts(0, 0)),
    ] {
        let mut rem = sentinel;
        // SAFETY: live timespecs.
        let r = unsafe { libc::nanosleep(&req, &mut rem) };
        push(
            &format!("nanosleep {what} rem={}", rem.tv_sec),
            r,
            if r < 0 { errno() } else { 0 },
        );
    }
    // SAFETY: null request: EFAULT.
    let r = unsafe { libc::nanosleep(std::ptr::null(), std::ptr::null_mut()) };
    push("nanosleep null", r, if r < 0 { errno() } else { 0 });
    let mut now = ts(0, 0);
    // SAFETY: live timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    let mut rnow = ts(0, 0);
    // SAFETY: live timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut rnow) };
    for (what, clock, flags, req) in [
        (
            "mono nsec 1e9",
            libc::CLOCK_MONOTONIC,
            0,
            ts(0, 1_000_000_000),
        ),
        (
            "mono abs nsec -1",
            libc::CLOCK_MONOTONIC,
            libc::TIMER_ABSTIME,
            ts(0, -1),
        ),
        (
            "mono abs sec -1",
            libc::CLOCK_MONOTONIC,
            libc::TIMER_ABSTIME,
            ts(-1, 0),
        ),
        (
            "thread cpu",
            libc::CLOCK_THREAD_CPUTIME_ID,
            0,
            ts(0, 1_000_000),
        ),
        ("bad clock", 12345, 0, ts(0, 1_000_000)),
        (
            "mono abs zero",
            libc::CLOCK_MONOTONIC,
            libc::TIMER_ABSTIME,
            ts(0, 0),
        ),
        (
            "mono abs past",
            libc::CLOCK_MONOTONIC,
            libc::TIMER_ABSTIME,
            ts(now.tv_sec - 1, 0),
        ),
        (
            "real abs past",
            libc::CLOCK_REALTIME,
            libc::TIMER_ABSTIME,
            ts(rnow.tv_sec - 1, 0),
        ),
        ("boot 1 ms", libc::CLOCK_BOOTTIME, 0, ts(0, 1_000_000)),
        ("tai 1 ms", libc::CLOCK_TAI, 0, ts(0, 1_000_000)),
        ("mono flags 2", libc::CLOCK_MONOTONIC, 2, ts(0, 1_000_000)),
        (
            "realtime coarse",
            libc::CLOCK_REALTIME_COARSE,
            0,
            ts(0, 1_000_000),
        ),
        ("mono raw", libc::CLOCK_MONOTONIC_RAW, 0, ts(0, 1_000_000)),
    ] {
        let mut rem = sentinel;
        // SAFETY: live timespecs.
        let r = unsafe { libc::clock_nanosleep(clock, flags, &req, &mut rem) };
        push(&format!("clock_nanosleep {what} rem={}", rem.tv_sec), r, 0);
    }
    // SAFETY: null request.
    let r = unsafe {
        libc::clock_nanosleep(
            libc::CLOCK_MONOTONIC,
            0,
            std::ptr::null(),
            std::ptr::null_mut(),
        )
    };
    push("clock_nanosleep null", r, 0);
    // An absolute monotonic deadline 50 ms ahead: it sleeps until then.
    let mut now = ts(0, 0);
    // SAFETY: live timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    let mut until = ts(now.tv_sec, now.tv_nsec + 50_000_000);
    if until.tv_nsec >= 1_000_000_000 {
        until.tv_sec += 1;
        until.tv_nsec -= 1_000_000_000;
    }
    let t = Instant::now();
    // SAFETY: live timespec.
    let r = unsafe {
        libc::clock_nanosleep(
            libc::CLOCK_MONOTONIC,
            libc::TIMER_ABSTIME,
            &until,
            std::ptr::null_mut(),
        )
    };
    push(
        &format!(
            "abs 50 ms slept {}",
            t.elapsed() >= Duration::from_millis(49)
        ),
        r,
        0,
    );
    // SAFETY: plain calls.
    unsafe {
        push("usleep 0", libc::usleep(0), 0);
        push("sleep 0", libc::sleep(0) as i32, 0);
        push("usleep 1000", libc::usleep(1000), 0);
    }
    out
}

#[test]
fn sleep_calls_with_odd_arguments_match_libc() {
    with_deadline(|| {
        let (fib, plain) = both(sleep_battery);
        for (f, p) in fib.iter().zip(&plain) {
            assert_eq!(f, p, "fiber vs libc\nlibc: {plain:?}\nfiber: {fib:?}");
        }
        assert_eq!(fib.len(), plain.len());
    });
}

// ---------------------------------------------------------------------------------------
// connect / accept4
// ---------------------------------------------------------------------------------------

/// A user-non-blocking connect, then connects again while in progress and once connected;
/// a refused one; accept4's flags.
fn connect_accept_battery() -> Vec<(String, i32, i32)> {
    let mut out = Vec::new();
    let mut push = |what: &str, r: i32| {
        let e = if r < 0 { errno() } else { 0 };
        out.push((what.to_string(), r.min(0), e));
    };
    let (l, sa, filler) = full_listener();
    // SAFETY: plain socket calls on live buffers.
    unsafe {
        let sap = (&sa as *const libc::sockaddr_in).cast();
        let c = libc::socket(
            libc::AF_INET,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        );
        push("nb connect", libc::connect(c, sap, SALEN));
        push("nb connect again", libc::connect(c, sap, SALEN));
        let a = libc::accept4(
            l,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            libc::SOCK_NONBLOCK,
        );
        push("accept4 nonblock", a);
        push(
            "accepted F_GETFL nb",
            libc::fcntl(a, libc::F_GETFL) & libc::O_NONBLOCK,
        );
        let mut b = [0u8; 4];
        push(
            "read accepted nb",
            libc::read(a, b.as_mut_ptr().cast(), 4) as i32,
        );
        // The SYN retransmission comes about 1 s later.
        let mut p = [pfd(c, libc::POLLOUT)];
        push("poll connected", libc::poll(p.as_mut_ptr(), 1, 5000));
        push("nb connect once connected", libc::connect(c, sap, SALEN));
        push(
            "bad flags",
            libc::accept4(l, std::ptr::null_mut(), std::ptr::null_mut(), 0x4000_0000),
        );
        let a2 = libc::accept4(
            l,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            libc::SOCK_CLOEXEC,
        );
        push("accept4 cloexec", a2);
        push(
            "accepted FD_CLOEXEC",
            libc::fcntl(a2, libc::F_GETFD) & libc::FD_CLOEXEC,
        );
        push(
            "accepted F_GETFL nb",
            libc::fcntl(a2, libc::F_GETFL) & libc::O_NONBLOCK,
        );
        for fd in [a, a2, c, filler, l] {
            libc::close(fd);
        }
        // Refused: a port nobody listens on (bound, not listening).
        let s = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        let mut sa2 = sockaddr_lo(0);
        libc::bind(s, (&sa2 as *const libc::sockaddr_in).cast(), SALEN);
        let mut got = SALEN;
        libc::getsockname(s, (&mut sa2 as *mut libc::sockaddr_in).cast(), &mut got);
        let c = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        push(
            "refused",
            libc::connect(c, (&sa2 as *const libc::sockaddr_in).cast(), SALEN),
        );
        push(
            "refused again",
            libc::connect(c, (&sa2 as *const libc::sockaddr_in).cast(), SALEN),
        );
        libc::close(c);
        libc::close(s);
    }
    out
}

#[test]
fn connect_and_accept4_battery_matches_libc() {
    with_deadline(|| {
        let (fib, plain) = both(connect_accept_battery);
        eprintln!("libc: {plain:?}");
        assert_eq!(fib, plain);
    });
}

/// A Unix stream listener with backlog 0 and one queued connection (its path, the listener
/// and the queued client).
fn full_unix_listener() -> (
    std::path::PathBuf,
    std::os::unix::net::UnixListener,
    UnixStream,
    libc::sockaddr_un,
) {
    static N: AtomicUsize = AtomicUsize::new(0);
    let path = std::env::temp_dir().join(format!(
        "fibra-hook-calls-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_file(&path);
    let l = std::os::unix::net::UnixListener::bind(&path).unwrap();
    // SAFETY: our listener.
    unsafe { libc::listen(l.as_raw_fd(), 0) };
    let q = UnixStream::connect(&path).unwrap();
    // SAFETY: all-zero is a valid sockaddr_un; the path fits.
    let mut sun: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    sun.sun_family = libc::AF_UNIX as _;
    for (i, b) in path.as_os_str().as_encoded_bytes().iter().enumerate() {
        sun.sun_path[i] = *b as _;
    }
    (path, l, q, sun)
}

const SUNLEN: libc::socklen_t = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;

/// With SO_SNDTIMEO and nobody accepting: EAGAIN at the timeout.
fn unix_backlog_timeout() -> (i32, i32, bool) {
    let (path, _l, _q, sun) = full_unix_listener();
    // SAFETY: plain socket calls on live buffers.
    let out = unsafe {
        let c = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        set_sndtimeo(c, 100);
        let t = Instant::now();
        let r = libc::connect(c, (&sun as *const libc::sockaddr_un).cast(), SUNLEN);
        let out = (
            r,
            if r < 0 { errno() } else { 0 },
            t.elapsed() >= Duration::from_millis(95),
        );
        libc::close(c);
        out
    };
    let _ = std::fs::remove_file(&path);
    out
}

#[test]
fn unix_connect_to_a_full_backlog_times_out_as_libc() {
    with_deadline(|| {
        same_as_libc(
            unix_backlog_timeout,
            vec![(-1, libc::EAGAIN, true)].pop().unwrap(),
            "Unix connect, full backlog, SO_SNDTIMEO",
        )
    });
}

/// No timeout: the connect waits until a thread accepts the queued client 100 ms later
/// (with a 2 s SO_SNDTIMEO as a bound, so that a missed wake-up ends as EAGAIN at 2 s).
fn unix_backlog_room(timeout_ms: u64) -> (i32, i32, bool) {
    let (path, l, _q, sun) = full_unix_listener();
    // SAFETY: plain socket calls on live buffers.
    let out = unsafe {
        let c = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if timeout_ms > 0 {
            set_sndtimeo(c, timeout_ms);
        }
        let lfd = l.as_raw_fd();
        let w = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            // SAFETY: our listener.
            let a = libc::accept(lfd, std::ptr::null_mut(), std::ptr::null_mut());
            assert!(a >= 0);
            a
        });
        let t = Instant::now();
        let r = libc::connect(c, (&sun as *const libc::sockaddr_un).cast(), SUNLEN);
        let out = (
            r,
            if r < 0 { errno() } else { 0 },
            t.elapsed() < Duration::from_millis(1000),
        );
        libc::close(w.join().unwrap());
        libc::close(c);
        out
    };
    drop(l);
    let _ = std::fs::remove_file(&path);
    out
}

#[test]
fn unix_connect_to_a_full_backlog_completes_when_room_comes() {
    with_deadline(|| {
        same_as_libc(
            || unix_backlog_room(2000),
            (0, 0, true),
            "Unix connect, full backlog, accepted 100 ms later",
        )
    });
}

/// The same without any timeout, in a child (the fiber may hang).
#[test]
fn unix_connect_to_a_full_backlog_without_timeout_ends() {
    child_ok(|| {
        assert_eq!(unix_backlog_room(0), (0, 0, true), "libc");
        let s = started(1);
        let h = s.submit(|| unix_backlog_room(0), None).unwrap();
        assert!(
            h.wait_timeout(Duration::from_secs(5)),
            "a fiber's blocking Unix connect still waits 5 s after the listener made room"
        );
        assert_eq!(h.join().unwrap(), (0, 0, true));
    });
}

// ---------------------------------------------------------------------------------------
// hook::without nested, and hooks in Drop while a fiber unwinds from a panic
// ---------------------------------------------------------------------------------------

#[test]
fn without_nests_and_restores_after_a_panic() {
    with_deadline(|| {
        let s = started(1);
        let got = s.block_on(|| {
            use fibra::hook::{is_active, without};
            let mut v = vec![is_active()];
            without(|| {
                v.push(is_active());
                v.push(without(is_active));
                v.push(is_active());
                fibra::sleep(Duration::from_millis(5));
                v.push(is_active());
            });
            v.push(is_active());
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                without(|| without(|| panic!("inner")))
            }));
            v.push(is_active());
            v
        });
        s.stop();
        assert_eq!(got, vec![true, false, false, false, false, true, true]);
    });
}

struct ReadOnDrop(Option<UnixStream>, Arc<std::sync::Mutex<Vec<u8>>>);

impl Drop for ReadOnDrop {
    fn drop(&mut self) {
        let a = self.0.take().unwrap();
        let mut b = [0u8; 3];
        // Waits for the bytes a thread writes 300 ms later; sleeps too.
        std::thread::sleep(Duration::from_millis(10));
        (&a).read_exact(&mut b).unwrap();
        self.1.lock().unwrap().extend_from_slice(&b);
    }
}

#[test]
fn hooked_calls_in_a_drop_while_a_fiber_unwinds_from_a_panic() {
    with_deadline(|| {
        let s = started(1);
        let stop = Arc::new(AtomicBool::new(false));
        let (ticks, tick) = crate::common::ticker(&s, stop.clone(), Duration::from_millis(5));
        let got = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (a, b) = UnixStream::pair().unwrap();
        let w = later(300, move || {
            (&b).write_all(b"abc").unwrap();
            std::thread::sleep(Duration::from_millis(200));
        });
        let g = got.clone();
        let h = s
            .submit(
                move || {
                    let _guard = ReadOnDrop(Some(a), g);
                    panic!("unwinding");
                },
                None,
            )
            .unwrap();
        assert!(h.wait_timeout(crate::common::LIMIT));
        // Counted as the reader ends: a blocked worker would not have ticked meanwhile.
        let ticked = ticks.load(Ordering::Relaxed);
        assert!(h.join().is_err());
        w.join().unwrap();
        stop.store(true, Ordering::Relaxed);
        finish(tick);
        s.stop();
        assert_eq!(&*got.lock().unwrap(), b"abc");
        assert!(
            ticked >= 3,
            "the worker was blocked: {ticked} ticks in 300 ms"
        );
    });
}

// ---------------------------------------------------------------------------------------
// getaddrinfo cancelled while it resolves
// ---------------------------------------------------------------------------------------

#[test]
fn getaddrinfo_in_fibers_cancelled_while_resolving() {
    child_ok(|| {
        use std::net::ToSocketAddrs;
        for threads in [1, 2] {
            let s = started(threads);
            for round in 0..5 {
                let ok = Arc::new(AtomicUsize::new(0));
                let handles: Vec<_> = (0..200)
                    .map(|_| {
                        let ok = ok.clone();
                        s.submit(
                            move || {
                                for _ in 0..1000 {
                                    // A raw getaddrinfo/freeaddrinfo pair too.
                                    let (r, e) = crate::resolve_localhost();
                                    if r == libc::EAI_SYSTEM && e == libc::ECANCELED {
                                        // Cancelled: every later call would fail the same
                                        // way at once, so a resolver loop ends here (as the
                                        // hook's docs ask of callers).
                                        break;
                                    }
                                    if ("localhost", 80).to_socket_addrs().is_ok() {
                                        ok.fetch_add(1, Ordering::Relaxed);
                                    }
                                }
                            },
                            None,
                        )
                        .unwrap()
                    })
                    .collect();
                std::thread::sleep(Duration::from_millis(20 + round * 15));
                for h in &handles {
                    h.cancel();
                }
                for h in handles {
                    assert!(
                        h.wait_timeout(Duration::from_secs(20)),
                        "a cancelled resolver hangs"
                    );
                    let _ = h.join();
                }
            }
            let n = s.block_on(|| ("localhost", 80).to_socket_addrs().map(|a| a.count()));
            assert!(n.unwrap() > 0);
            s.stop();
        }
    });
}

// ---------------------------------------------------------------------------------------
// fortified forms: n > buflen aborts as glibc's do
// ---------------------------------------------------------------------------------------

extern "C" {
    fn __read_chk(fd: i32, buf: *mut libc::c_void, n: usize, buflen: usize) -> isize;
    fn __recv_chk(fd: i32, buf: *mut libc::c_void, n: usize, buflen: usize, flags: i32) -> isize;
    fn __poll_chk(fds: *mut libc::pollfd, n: libc::nfds_t, timeout: i32, fdslen: usize) -> i32;
}

fn chk_call(which: &str) {
    let (a, b) = UnixStream::pair().unwrap();
    (&b).write_all(b"0123456789").unwrap();
    let mut buf = [0u8; 16];
    // SAFETY: each call reads at most 8 bytes into a 16-byte buffer; it is told a smaller
    // buffer on purpose, and must abort before touching it.
    unsafe {
        match which {
            "read_ok" => assert_eq!(__read_chk(a.as_raw_fd(), buf.as_mut_ptr().cast(), 4, 4), 4),
            "read" => {
                __read_chk(a.as_raw_fd(), buf.as_mut_ptr().cast(), 8, 4);
            }
            "recv" => {
                __recv_chk(a.as_raw_fd(), buf.as_mut_ptr().cast(), 8, 4, 0);
            }
            "poll" => {
                let mut p = [pfd(a.as_raw_fd(), libc::POLLIN)];
                __poll_chk(p.as_mut_ptr(), 2, 0, std::mem::size_of::<libc::pollfd>());
            }
            _ => unreachable!(),
        }
    }
}

/// Runs `chk_call(which)` in a child process, in a fiber or on its plain test thread, and
/// checks how the child ended, which is the same in a fiber as libc's own call on a plain
/// thread: a call told the truth about its buffer returns; one told a buffer smaller than
/// what it may write aborts with glibc's "buffer overflow detected" (SIGABRT).
fn fortified_call_ends_as_in_libc(which: &'static str, in_fiber: bool) {
    let run = in_child(|| {
        if in_fiber {
            let s = started(1);
            s.block_on(move || chk_call(which));
        } else {
            chk_call(which);
        }
    });
    let outcome = (
        run.signal(),
        run.stderr.contains("buffer overflow detected"),
        run.passed(),
    );
    let libc = if which == "read_ok" {
        (None, false, true)
    } else {
        (Some(libc::SIGABRT), true, false)
    };
    assert_eq!(
        outcome, libc,
        "{which} (in a fiber: {in_fiber}): (signal, overflow reported, returned); libc's \
         own call on a plain thread ends as {libc:?}"
    );
}

#[test]
fn a_fortified_read_within_its_buffer_returns_on_a_plain_thread() {
    fortified_call_ends_as_in_libc("read_ok", false);
}

#[test]
fn a_fortified_read_within_its_buffer_returns_in_a_fiber() {
    fortified_call_ends_as_in_libc("read_ok", true);
}

#[test]
fn a_fortified_read_past_its_buffer_aborts_on_a_plain_thread() {
    fortified_call_ends_as_in_libc("read", false);
}

#[test]
fn a_fortified_read_past_its_buffer_aborts_in_a_fiber() {
    fortified_call_ends_as_in_libc("read", true);
}

#[test]
fn a_fortified_recv_past_its_buffer_aborts_on_a_plain_thread() {
    fortified_call_ends_as_in_libc("recv", false);
}

#[test]
fn a_fortified_recv_past_its_buffer_aborts_in_a_fiber() {
    fortified_call_ends_as_in_libc("recv", true);
}

#[test]
fn a_fortified_poll_past_its_array_aborts_on_a_plain_thread() {
    fortified_call_ends_as_in_libc("poll", false);
}

#[test]
fn a_fortified_poll_past_its_array_aborts_in_a_fiber() {
    fortified_call_ends_as_in_libc("poll", true);
}

// ---------------------------------------------------------------------------------------
// select: one fd set passed as both the read and the write set
// ---------------------------------------------------------------------------------------

fn select_aliased_sets() -> (i32, bool, bool) {
    let (a, _b) = UnixStream::pair().unwrap();
    let (c, d) = UnixStream::pair().unwrap();
    (&d).write_all(b"x").unwrap();
    // SAFETY: a zeroed fd_set is empty; our fds are below FD_SETSIZE.
    unsafe {
        let mut set: libc::fd_set = std::mem::zeroed();
        libc::FD_SET(a.as_raw_fd(), &mut set);
        libc::FD_SET(c.as_raw_fd(), &mut set);
        let mut tv = libc::timeval {
            tv_sec: 1,
            tv_usec: 0,
        };
        let n = a.as_raw_fd().max(c.as_raw_fd()) + 1;
        let r = libc::select(n, &mut set, &mut set, std::ptr::null_mut(), &mut tv);
        (
            r,
            libc::FD_ISSET(a.as_raw_fd(), &set),
            libc::FD_ISSET(c.as_raw_fd(), &set),
        )
    }
}

#[test]
fn select_with_one_set_as_read_and_write_matches_libc() {
    with_deadline(|| {
        let (fib, plain) = both(select_aliased_sets);
        eprintln!("libc: {plain:?} fiber: {fib:?}");
        assert_eq!(fib, plain);
    });
}

/// A blocking connect refused, then the same socket connects again: libc tries again (and
/// is refused again); it must not fail with another error.
fn refused_twice() -> Vec<(i32, i32)> {
    let mut out = Vec::new();
    // SAFETY: plain socket calls on live buffers.
    unsafe {
        let s = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        let mut sa = sockaddr_lo(0);
        libc::bind(s, (&sa as *const libc::sockaddr_in).cast(), SALEN);
        let mut got = SALEN;
        libc::getsockname(s, (&mut sa as *mut libc::sockaddr_in).cast(), &mut got);
        let c = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        for _ in 0..2 {
            let r = libc::connect(c, (&sa as *const libc::sockaddr_in).cast(), SALEN);
            out.push((r, if r < 0 { errno() } else { 0 }));
        }
        libc::close(c);
        libc::close(s);
    }
    out
}

#[test]
fn a_connect_retried_after_refusal_is_refused_again() {
    with_deadline(|| {
        same_as_libc(
            refused_twice,
            vec![(-1, libc::ECONNREFUSED), (-1, libc::ECONNREFUSED)],
            "connect, refused, then again",
        )
    });
}

// ---- select with results to write into read-only memory ----

/// A page holding `init`'s bytes, made read-only; returns its address.
fn read_only_copy<T: Copy>(init: T) -> *mut T {
    // SAFETY: a fresh anonymous mapping, written while writable, then protected.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(p, libc::MAP_FAILED);
        std::ptr::write(p.cast::<T>(), init);
        assert_eq!(libc::mprotect(p, 4096, libc::PROT_READ), 0);
        p.cast()
    }
}

/// `select` with `readfds` in read-only memory and one byte ready: `(result, errno)`.
fn select_into_a_read_only_set() -> (i32, i32) {
    let mut sv = [0; 2];
    // SAFETY: a valid out array.
    assert_eq!(
        unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM, 0, sv.as_mut_ptr()) },
        0
    );
    // SAFETY: a valid fd and buffer.
    assert_eq!(unsafe { libc::write(sv[1], b"x".as_ptr().cast(), 1) }, 1);
    // SAFETY: zeroed fd_set, filled with FD_SET.
    let mut set: libc::fd_set = unsafe { std::mem::zeroed() };
    // SAFETY: a valid fd below FD_SETSIZE.
    unsafe { libc::FD_SET(sv[0], &mut set) };
    let mut tv = libc::timeval {
        tv_sec: 5,
        tv_usec: 0,
    };
    // SAFETY: the set is mapped read-only; the kernel checks it.
    let r = unsafe {
        libc::select(
            sv[0] + 1,
            read_only_copy(set),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            &mut tv,
        )
    };
    let e = if r < 0 { errno() } else { 0 };
    // SAFETY: our fds.
    unsafe {
        libc::close(sv[0]);
        libc::close(sv[1]);
    }
    (r, e)
}

/// The kernel cannot write the set back: `EFAULT`, where the hook wrote the set itself and
/// died of SIGSEGV (so in a child). A read-only timeval is not tested: glibc's own
/// `select` updates it itself and dies; the hook leaves it as it was, as the kernel does.
#[test]
fn select_with_a_read_only_fd_set_is_efault_as_in_libc() {
    child_ok(|| {
        same_as_libc(
            select_into_a_read_only_set,
            (-1, libc::EFAULT),
            "a read-only set",
        );
    });
}
