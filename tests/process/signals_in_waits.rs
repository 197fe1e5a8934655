//! Signals raining on every thread while fibers and plain threads wait in hooked calls and
//! fibra's own waits (and a plain thread's `connect` the kernel restarts after a fiber
//! switched its socket); hooked waits on fds the reactor cannot take; a `start()` the OS
//! refused every thread; `JoinSet` drained across a cancelled drainer and from a plain
//! thread; hooked scatter/gather calls with a partly bad iovec array. Everything that
//! changes a signal disposition, a uid or a limit runs in a child process (`in_child`).

#![cfg_attr(not(feature = "hook"), allow(dead_code, unused_imports))]

use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{cap_threads, child_ok, errno, in_child, uncap_threads, ChildRun, LIMIT};

/// Fails unless the child's body returned and it exited with 0, with the end of its stderr
/// less the lines the signal handler ([`on_signal`]) writes.
fn assert_passed(run: ChildRun) {
    if run.passed() {
        return;
    }
    let lines: Vec<&str> = run.stderr.lines().filter(|l| *l != "sig").collect();
    let tail = lines[lines.len().saturating_sub(60)..].join("\n");
    panic!(
        "the child of {} ended with {:?} (signal {:?})\n--- its stderr ---\n{tail}",
        run.test,
        run.status,
        run.signal()
    );
}

// ============================================================== 1. signals

static HANDLED: AtomicUsize = AtomicUsize::new(0);

/// Counts; every 4096th time writes to stderr (allowed: the standard streams are never
/// switched), through the hooked `write`. Keeps `errno`, as a handler must.
extern "C" fn on_signal(_: libc::c_int) {
    // SAFETY: errno's location is the thread's own.
    let saved = unsafe { *libc::__errno_location() };
    if HANDLED.fetch_add(1, Ordering::Relaxed).is_multiple_of(4096) {
        // SAFETY: a static buffer to stderr.
        unsafe { libc::write(2, b"sig\n".as_ptr().cast(), 4) };
    }
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = saved };
}

/// A thread that signals every other thread every ~100 µs, and the process as a whole every
/// tenth round, until `stop`; returns how many rounds it made.
fn rain(stop: Arc<AtomicBool>) -> std::thread::JoinHandle<usize> {
    std::thread::spawn(move || {
        let mut sent = 0usize;
        while !stop.load(Ordering::Relaxed) {
            crate::common::signal_other_threads(libc::SIGUSR1);
            if sent.is_multiple_of(10) {
                // SAFETY: a handled signal at our own process.
                unsafe { libc::kill(libc::getpid(), libc::SIGUSR1) };
            }
            sent += 1;
            crate::common::block_thread(Duration::from_micros(100));
        }
        sent
    })
}

const T: Duration = Duration::from_millis(200);

/// A wait bounded by `T` took at least `T` and well under 10 s.
fn timed(what: &str, took: Duration) -> Result<(), String> {
    if took < T || took > Duration::from_secs(10) {
        return Err(format!("{what}: took {took:?}, its timeout is {T:?}"));
    }
    Ok(())
}

fn check_io<R: std::fmt::Debug>(what: &str, r: R, ok: bool, took: Duration) -> Result<(), String> {
    if !ok {
        return Err(format!("{what}: {r:?} (errno {}) after {took:?}", errno()));
    }
    timed(what, took)
}

#[cfg(feature = "hook")]
fn select_read(fd: i32, timeout: Option<Duration>) -> i32 {
    // SAFETY: an fd_set on our stack, fd below FD_SETSIZE.
    unsafe {
        let mut set: libc::fd_set = std::mem::zeroed();
        libc::FD_ZERO(&mut set);
        libc::FD_SET(fd, &mut set);
        let mut tv = timeout.map(|t| libc::timeval {
            tv_sec: t.as_secs() as _,
            tv_usec: t.subsec_micros() as _,
        });
        let tvp = tv
            .as_mut()
            .map_or(std::ptr::null_mut(), |t| t as *mut libc::timeval);
        libc::select(
            fd + 1,
            &mut set,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            tvp,
        )
    }
}

/// One kind of timed wait in a fiber, by number; each must end at its timeout (or when its
/// peer acts, 200 ms on), never with EINTR, never early.
#[cfg(feature = "hook")]
fn fiber_wait(kind: usize) -> Result<(), String> {
    use std::net::{TcpListener, UdpSocket};
    use std::os::unix::net::UnixStream;
    let t0 = Instant::now();
    match kind {
        0 => {
            let (a, _b) = UnixStream::pair().unwrap();
            a.set_read_timeout(Some(T)).unwrap();
            let r = (&a).read(&mut [0u8; 4]).map_err(|e| e.kind());
            check_io(
                "read SO_RCVTIMEO",
                r,
                r == Err(ErrorKind::WouldBlock),
                t0.elapsed(),
            )
        }
        1 => {
            let (a, _b) = UnixStream::pair().unwrap();
            let mut p = libc::pollfd {
                fd: a.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one live pollfd.
            let r = unsafe { libc::poll(&mut p, 1, T.as_millis() as i32) };
            check_io("poll 200 ms", r, r == 0, t0.elapsed())
        }
        2 => {
            let (a, _b) = UnixStream::pair().unwrap();
            let r = select_read(a.as_raw_fd(), Some(T));
            check_io("select 200 ms", r, r == 0, t0.elapsed())
        }
        3 => {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            crate::common::set_socket_timeout(l.as_raw_fd(), libc::SO_RCVTIMEO, T);
            // SAFETY: no address wanted.
            let r =
                unsafe { libc::accept(l.as_raw_fd(), std::ptr::null_mut(), std::ptr::null_mut()) };
            let e = errno();
            check_io(
                "accept SO_RCVTIMEO",
                (r, e),
                r == -1 && e == libc::EAGAIN,
                t0.elapsed(),
            )
        }
        4 => {
            let u = UdpSocket::bind("127.0.0.1:0").unwrap();
            u.set_read_timeout(Some(T)).unwrap();
            let mut buf = [0u8; 8];
            // SAFETY: a live buffer.
            let r = unsafe { libc::recv(u.as_raw_fd(), buf.as_mut_ptr().cast(), 8, 0) };
            let e = errno();
            check_io(
                "recv SO_RCVTIMEO",
                (r, e),
                r == -1 && e == libc::EAGAIN,
                t0.elapsed(),
            )
        }
        5 => {
            let ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: T.as_nanos() as _,
            };
            // SAFETY: a live timespec.
            let r = unsafe { libc::nanosleep(&ts, std::ptr::null_mut()) };
            check_io("nanosleep", r, r == 0, t0.elapsed())
        }
        6 => {
            let m = Arc::new(fibra::sync::Mutex::new(0));
            let (tx, rx) = fibra::sync::oneshot::channel::<()>();
            let m2 = m.clone();
            let holder = fibra::spawn(move || {
                let _g = m2.lock().unwrap();
                let _ = tx.send(());
                fibra::sleep(T);
            });
            rx.recv().unwrap();
            let t0 = Instant::now();
            let g = m.lock();
            let took = t0.elapsed();
            drop(g);
            holder.join().unwrap();
            // The holder slept T from before the lock was asked for.
            if took > Duration::from_secs(10) || took < T / 2 {
                return Err(format!("Mutex::lock took {took:?}"));
            }
            Ok(())
        }
        7 => {
            let m = fibra::sync::Mutex::new(());
            let c = fibra::sync::Condvar::new();
            let g = m.lock().unwrap();
            let (_g, r) = c.wait_timeout(g, T).unwrap();
            check_io(
                "Condvar::wait_timeout",
                r.timed_out(),
                r.timed_out(),
                t0.elapsed(),
            )
        }
        8 => {
            let (_tx, rx) = fibra::sync::mpsc::channel::<u8>();
            let r = rx.recv_timeout(T);
            check_io("mpsc recv_timeout", r, r.is_err(), t0.elapsed())
        }
        9 => {
            let s = fibra::sync::Semaphore::new(0);
            let r = s.acquire_timeout(T).is_some();
            check_io("Semaphore::acquire_timeout", r, !r, t0.elapsed())
        }
        10 => {
            fibra::sleep(T);
            timed("fibra::sleep", t0.elapsed())
        }
        11 => {
            let r = fibra::unblock(|| {
                let t0 = Instant::now();
                std::thread::sleep(T);
                t0.elapsed()
            });
            timed("unblock(thread::sleep) on the pool", r)?;
            timed("unblock", t0.elapsed())
        }
        12 => {
            // Infinite waits woken by a peer fiber after T.
            let (a, b) = UnixStream::pair().unwrap();
            let w = fibra::spawn(move || {
                fibra::sleep(T);
                (&b).write_all(b"z").unwrap();
                b
            });
            let mut p = libc::pollfd {
                fd: a.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one live pollfd.
            let r = unsafe { libc::poll(&mut p, 1, -1) };
            let took = t0.elapsed();
            let mut one = [0u8; 1];
            let n = (&a).read(&mut one).map_err(|e| e.kind());
            drop(w.join().unwrap());
            check_io("poll(-1) then read", (r, n), r == 1 && n == Ok(1), took)
        }
        13 => {
            let (a, b) = UnixStream::pair().unwrap();
            let w = fibra::spawn(move || {
                fibra::sleep(T);
                (&b).write_all(b"z").unwrap();
                b
            });
            let r = select_read(a.as_raw_fd(), None);
            let took = t0.elapsed();
            drop(w.join().unwrap());
            check_io("select(no timeout)", r, r == 1, took)
        }
        14 => {
            let (_tx, rx) = fibra::sync::mpsc::channel::<u8>();
            let (tx2, rx2) = fibra::sync::mpsc::channel::<u8>();
            let w = fibra::spawn(move || {
                fibra::sleep(T);
                tx2.send(7).unwrap();
            });
            drop(rx);
            let r = rx2.recv();
            w.join().unwrap();
            check_io("mpsc recv woken", r, r == Ok(7), t0.elapsed())
        }
        _ => {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = l.local_addr().unwrap();
            let c = fibra::spawn(move || {
                fibra::sleep(T);
                std::net::TcpStream::connect(addr)
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            });
            let r = l.accept().map(|_| ()).map_err(|e| e.to_string());
            let took = t0.elapsed();
            let cr = c.join().unwrap();
            check_io("accept woken", (&r, &cr), r.is_ok() && cr.is_ok(), took)
        }
    }
}

/// Signals (with or without `SA_RESTART`) rain on every thread and on the process while
/// fibers wait in timed and untimed hooked calls and in fibra's own waits, and plain
/// threads wait in hooked calls on sockets a fiber switched: each wait ends as it would
/// without signals, at (never before) its timeout or when its peer acts; none fails with
/// `EINTR`; the signal handler's own `write(2, …)` works.
#[cfg(feature = "hook")]
#[test]
fn signals_rain_while_everything_waits_without_restart() {
    assert_passed(in_child(|| signals_rain(false)));
}

/// The same rain with `SA_RESTART`.
#[cfg(feature = "hook")]
#[test]
fn signals_rain_while_everything_waits_with_restart() {
    assert_passed(in_child(|| signals_rain(true)));
}

#[cfg(feature = "hook")]
fn signals_rain(restart: bool) {
    use std::os::unix::net::UnixStream;
    crate::common::install_signal(libc::SIGUSR1, restart, on_signal);
    let s = crate::common::shared_started(2);
    let stop = Arc::new(AtomicBool::new(false));
    let signaller = rain(stop.clone());
    const KINDS: usize = 16;
    let fibers: Vec<_> = (0..2 * KINDS)
        .map(|i| {
            s.submit(
                move || -> Result<(), String> {
                    for _ in 0..3 {
                        fiber_wait(i % KINDS)?;
                    }
                    Ok(())
                },
                None,
            )
            .unwrap()
        })
        .collect();
    // Plain threads on sockets a fiber switched: a timed read, and an untimed one that data
    // ends after T.
    let plain: Vec<std::thread::JoinHandle<Result<(), String>>> = (0..2)
        .map(|k| {
            let (a, b) = UnixStream::pair().unwrap();
            let a = Arc::new(a);
            let a2 = a.clone();
            // The fiber's write switches the open file to O_NONBLOCK.
            crate::common::finish(
                s.submit(move || (&*a2).write_all(b"p").map_err(|e| e.kind()), None)
                    .unwrap(),
            )
            .unwrap();
            std::thread::spawn(move || {
                let mut buf = [0u8; 8];
                // The writer's T runs from here: the untimed read is timed from here too.
                let start = Instant::now();
                if k == 0 {
                    a.set_read_timeout(Some(T)).unwrap();
                } else {
                    std::thread::spawn(move || {
                        crate::common::block_thread(T);
                        (&b).write_all(b"q").unwrap();
                        crate::common::block_thread(T);
                        drop(b);
                    });
                }
                let mut rounds = 0;
                loop {
                    let t0 = Instant::now();
                    let r = (&*a)
                        .read(&mut buf)
                        .map_err(|e| (e.kind(), e.raw_os_error()));
                    let took = if k == 0 { t0 } else { start }.elapsed();
                    if k == 0 {
                        check_io(
                            "plain thread read SO_RCVTIMEO on a switched socket",
                            r,
                            matches!(r, Err((ErrorKind::WouldBlock, _))),
                            took,
                        )?;
                        rounds += 1;
                        if rounds == 3 {
                            return Ok(());
                        }
                    } else {
                        return check_io(
                            "plain thread read on a switched socket, data after T",
                            r,
                            r == Ok(1),
                            took,
                        );
                    }
                }
            })
        })
        .collect();
    let mut errs = Vec::new();
    for (i, h) in fibers.into_iter().enumerate() {
        if !h.wait_timeout(LIMIT) {
            errs.push(format!("fiber {i} (kind {}) hung", i % KINDS));
            continue;
        }
        match h.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => errs.push(format!("fiber {i}: {e}")),
            Err(e) => errs.push(format!("fiber {i} failed: {e:?}")),
        }
    }
    for (i, t) in plain.into_iter().enumerate() {
        match t.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => errs.push(format!("plain thread {i}: {e}")),
            Err(_) => errs.push(format!("plain thread {i} panicked")),
        }
    }
    stop.store(true, Ordering::Relaxed);
    let sent = signaller.join().unwrap();
    eprintln!(
        "{sent} signal rounds, {} signals handled",
        HANDLED.load(Ordering::Relaxed)
    );
    assert!(errs.is_empty(), "ERRORS: {}", errs.join(" || "));
    assert!(sent > 100, "only {sent} signal rounds");
    crate::common::every_worker_runs(&s);
    s.stop();
}

/// A listener whose accept queue is full (backlog 0, one connection queued), so that a new
/// connect to it waits (its SYNs are dropped and retransmitted) until the queue has room.
/// Returns the listener, its address and the queued clients.
#[cfg(feature = "hook")]
fn full_listener() -> (
    std::net::TcpListener,
    std::net::SocketAddr,
    Vec<std::net::TcpStream>,
) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    // SAFETY: our listening socket.
    assert_eq!(unsafe { libc::listen(l.as_raw_fd(), 0) }, 0);
    let addr = l.local_addr().unwrap();
    let mut queued = Vec::new();
    loop {
        match std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(300)) {
            Ok(c) => queued.push(c),
            Err(_) => break,
        }
        assert!(queued.len() < 64, "the accept queue never filled");
    }
    (l, addr, queued)
}

/// A blocking `connect` on a plain thread to a listener with a full queue; `switch` runs
/// once the thread is inside it (a fiber's hooked call on the same socket switches it to
/// O_NONBLOCK, or nothing); then SA_RESTART signals interrupt the thread, and the queue is
/// drained. Returns the connect's result and errno.
#[cfg(feature = "hook")]
fn restarted_connect(switch: impl FnOnce(i32)) -> (i32, i32) {
    let (l, addr, queued) = full_listener();
    // SAFETY: a fresh socket of our own.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) };
    assert!(fd >= 0);
    let tid = Arc::new(AtomicI32::new(0));
    let t2 = tid.clone();
    let connecting = std::thread::spawn(move || {
        t2.store(crate::common::gettid(), Ordering::SeqCst);
        let std::net::SocketAddr::V4(a) = addr else {
            unreachable!()
        };
        let sin = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: a.port().to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from(*a.ip()).to_be(),
            },
            sin_zero: [0; 8],
        };
        // SAFETY: a live sockaddr_in of the size given.
        let r = unsafe {
            libc::connect(
                fd,
                (&sin as *const libc::sockaddr_in).cast(),
                size_of::<libc::sockaddr_in>() as libc::socklen_t,
            )
        };
        (r, errno())
    });
    while tid.load(Ordering::SeqCst) == 0 {
        std::thread::yield_now();
    }
    crate::common::block_thread(Duration::from_millis(200));
    switch(fd);
    for _ in 0..3 {
        crate::common::tgkill(tid.load(Ordering::SeqCst), libc::SIGUSR1);
        crate::common::block_thread(Duration::from_millis(50));
    }
    // Room in the queue: the next SYN retransmission gets through.
    let mut accepted = Vec::new();
    l.set_nonblocking(true).unwrap();
    let give_up = Instant::now() + LIMIT;
    while !connecting.is_finished() && Instant::now() < give_up {
        if let Ok((c, _)) = l.accept() {
            accepted.push(c);
        }
        crate::common::block_thread(Duration::from_millis(20));
    }
    let r = connecting.join().unwrap();
    drop((queued, accepted));
    // SAFETY: ours.
    unsafe { libc::close(fd) };
    r
}

/// A plain thread in a real blocking `connect` (the socket not switched yet) whose socket a
/// fiber switches meanwhile; a signal with SA_RESTART (a profiler's SIGPROF) interrupts the
/// thread and the kernel restarts the connect, which now meets O_NONBLOCK and fails with
/// `EALREADY`, an error a blocking connect never returns after a restart. libc (no fiber
/// switched the socket): the connect waits and returns 0 once the listener has room. The
/// hooked `read`/`accept` go on after such a restart (`switched_under`); `connect` does not.
#[cfg(feature = "hook")]
#[test]
fn a_restarted_connect_on_a_plain_thread_after_a_fiber_switched_the_socket() {
    assert_passed(in_child(|| {
        crate::common::install_signal(libc::SIGUSR1, true, on_signal);
        let s = crate::common::shared_started(1);
        let libc_ref = restarted_connect(|_| {});
        let hooked = restarted_connect(|fd| {
            // A fiber reads the connecting socket (waiting 50 ms at most): its first hooked
            // call switches the open file to O_NONBLOCK.
            let h = s
                .submit(
                    move || {
                        crate::common::set_socket_timeout(
                            fd,
                            libc::SO_RCVTIMEO,
                            Duration::from_millis(50),
                        );
                        let mut one = [0u8; 1];
                        // SAFETY: a live buffer.
                        let r = unsafe { libc::read(fd, one.as_mut_ptr().cast(), 1) };
                        (r, errno())
                    },
                    None,
                )
                .unwrap();
            eprintln!("the fiber's read: {:?}", crate::common::finish(h));
        });
        eprintln!("libc: {libc_ref:?}; after the switch: {hooked:?}");
        assert_eq!(
            libc_ref,
            (0, libc_ref.1),
            "libc's blocking connect waits and succeeds"
        );
        assert_eq!(
            hooked.0, 0,
            "the restarted blocking connect failed with errno {} (libc: waits, returns 0)",
            hooked.1
        );
        s.stop();
    }));
}

// ==================================================== 2. fds the reactor cannot take

/// CPU time (user + system) of this process so far.
fn cpu_time() -> Duration {
    // SAFETY: a zeroed rusage filled by the kernel.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer.
    assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) }, 0);
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// How a fiber waits for `fd` to become readable, with no timeout.
#[cfg(feature = "hook")]
#[derive(Clone, Copy, Debug)]
enum Untimed {
    Poll,
    Select,
    Ppoll,
    Read,
}

#[cfg(feature = "hook")]
fn wait_untimed(how: Untimed, fd: i32) -> (isize, i32) {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: live arguments throughout.
    let r = unsafe {
        match how {
            Untimed::Poll => libc::poll(&mut p, 1, -1) as isize,
            Untimed::Select => select_read(fd, None) as isize,
            Untimed::Ppoll => libc::ppoll(&mut p, 1, std::ptr::null(), std::ptr::null()) as isize,
            Untimed::Read => {
                let mut one = [0u8; 1];
                libc::read(fd, one.as_mut_ptr().cast(), 1)
            }
        }
    };
    (r, errno())
}

/// With the descriptor table full before the reactor's first registration (so it cannot
/// make its epoll instance), a fiber waits with no timeout in `poll`, `select`, `ppoll` and
/// a blocking `read` for a socket that becomes readable 300 ms later (2 s for the CPU
/// check): each returns once the data is there, with little CPU spent meanwhile, and a
/// ticker fiber on the same (only) worker keeps ticking throughout (the worker thread is
/// never blocked). libc: each returns 1 when the data comes.
#[cfg(feature = "hook")]
#[test]
fn untimed_waits_on_fds_the_reactor_cannot_take_return_when_data_comes() {
    child_ok(|| {
        use std::os::unix::net::UnixStream;
        let s = Arc::new(fibra::Scheduler::builder().threads(1).build().unwrap());
        s.start();
        let pairs: Vec<(UnixStream, UnixStream)> =
            (0..5).map(|_| UnixStream::pair().unwrap()).collect();
        let held = crate::common::fill_descriptor_table(0);
        eprintln!(
            "holding {} fds; the reactor has not been created",
            held.len()
        );
        let mut bad = Vec::new();

        // CPU over a 2 s wait, nothing else running.
        let (r0, w0) = &pairs[0];
        let fd = r0.as_raw_fd();
        let cpu0 = cpu_time();
        let h = s.spawn(move || {
            let t0 = Instant::now();
            (wait_untimed(Untimed::Poll, fd), t0.elapsed())
        });
        crate::common::block_thread(Duration::from_secs(2));
        let cpu = cpu_time() - cpu0;
        (&*w0).write_all(b"x").unwrap();
        assert!(h.wait_timeout(LIMIT), "poll(-1) never returned");
        let (r, took) = h.join().unwrap();
        eprintln!("poll(-1) over 2 s: {r:?} after {took:?}, {cpu:?} of CPU");
        if r.0 != 1 || cpu > Duration::from_millis(300) {
            bad.push(format!("poll(-1) over 2 s: {r:?}, CPU {cpu:?}"));
        }

        for (i, how) in [
            Untimed::Poll,
            Untimed::Select,
            Untimed::Ppoll,
            Untimed::Read,
        ]
        .into_iter()
        .enumerate()
        {
            let (r, w) = &pairs[i + 1];
            let fd = r.as_raw_fd();
            let stop = Arc::new(AtomicBool::new(false));
            let (ticks, ticker) = crate::common::ticker(&s, stop.clone(), Duration::from_millis(5));
            crate::common::wait_until("the ticker to start", || ticks.load(Ordering::Relaxed) > 0);
            let h = s.spawn(move || {
                let t0 = Instant::now();
                (wait_untimed(how, fd), t0.elapsed())
            });
            crate::common::block_thread(Duration::from_millis(50));
            let before = ticks.load(Ordering::Relaxed);
            crate::common::block_thread(Duration::from_millis(300));
            let during = ticks.load(Ordering::Relaxed) - before;
            (&*w).write_all(b"x").unwrap();
            let returned = h.wait_timeout(Duration::from_secs(10));
            stop.store(true, Ordering::Relaxed);
            let out = if returned {
                format!("{:?}", h.join().unwrap())
            } else {
                "never returned".into()
            };
            eprintln!("{how:?}: {out}; the ticker ticked {during} times in 300 ms of the wait");
            if !returned || during < 5 {
                bad.push(format!(
                    "{how:?}: {out}; the ticker on the same worker ticked {during} times in 300 ms \
                     (every 5 ms expected): the wait blocked the worker thread"
                ));
            }
            assert!(ticker.wait_timeout(LIMIT), "the ticker ended");
        }
        drop(held);
        assert!(bad.is_empty(), "ERRORS: {}", bad.join(" || "));
        s.stop();
    });
}

// ============================================ 3. start() after the OS refused threads

/// How the shutdown of a scheduler whose `start` got no thread at all is asked for.
#[derive(Clone, Copy, Debug)]
enum Ending {
    Stop,
    StopTimeout0,
    Drop,
}

/// A two-worker scheduler whose `start` the OS refused every thread (none started), with a
/// task submitted before it (in the shared injector, not in a worker's queue); then the
/// scheduler is shut down while threads are still refused. The shutdown must end and the
/// task's handle must report cancelled (as a task queued on a worker that never started
/// does), so that its joiner does not wait for ever.
fn refused_start_then(ending: Ending, uid: libc::uid_t) {
    let s = fibra::Scheduler::builder().threads(2).build().unwrap();
    let h = s.submit(|| 7, None).unwrap();
    // The thread that ends the scheduler is made before the cap.
    let (go_tx, go_rx) = std::sync::mpsc::channel::<fibra::Scheduler>();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<Duration>();
    std::thread::spawn(move || {
        let s = go_rx.recv().unwrap();
        let t0 = Instant::now();
        match ending {
            Ending::Stop => s.stop(),
            Ending::StopTimeout0 => {
                s.stop_timeout(Duration::ZERO);
            }
            Ending::Drop => {}
        }
        drop(s);
        let _ = done_tx.send(t0.elapsed());
    });
    cap_threads(uid, 0);
    let refused = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| s.start()));
    let msg = crate::common::panic_message(&*refused.expect_err("start under the cap panics"));
    eprintln!("start refused: {msg:?}");
    go_tx.send(s).unwrap();
    let ended = done_rx.recv_timeout(Duration::from_secs(20));
    let settled = h.wait_timeout(Duration::from_secs(5));
    eprintln!("{ending:?}: ended {ended:?}; the task's handle settled: {settled}");
    assert!(
        ended.is_ok(),
        "{ending:?} did not return within 20 s (a task queued before the refused start is \
         never run nor failed)"
    );
    assert!(
        settled,
        "{ending:?} returned, but the handle of the task queued before the refused start \
         never completes: its joiner hangs"
    );
    assert!(h.join().unwrap_err().is_cancelled());
}

/// `stop()` of a scheduler whose `start` got no worker thread, with a task queued.
#[test]
fn stop_after_a_start_that_got_no_thread_ends() {
    child_ok(|| refused_start_then(Ending::Stop, 61_801));
}

/// `stop_timeout(0)` of a scheduler whose `start` got no worker thread, with a task queued.
#[test]
fn stop_timeout_after_a_start_that_got_no_thread_settles_the_task() {
    child_ok(|| refused_start_then(Ending::StopTimeout0, 61_802));
}

/// Dropping (without `stop`) a scheduler whose `start` got no worker thread, with a task
/// queued.
#[test]
fn drop_after_a_start_that_got_no_thread_settles_the_task() {
    child_ok(|| refused_start_then(Ending::Drop, 61_803));
}

/// `block_on` as the first call, under the cap: its `start` is refused and the panic
/// reaches the caller, who takes it as "not run" — but the closure stays queued, and the
/// retried `start` runs it, detached, its result dropped. libc-like expectation: the
/// closure is either run for the caller (its value returned) or not run at all.
#[test]
fn block_on_whose_start_is_refused_does_not_run_its_closure_later() {
    child_ok(|| {
        let s = fibra::Scheduler::builder().threads(2).build().unwrap();
        let runs = Arc::new(AtomicUsize::new(0));
        cap_threads(61_804, 0);
        let r = runs.clone();
        let first = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            s.block_on(move || {
                r.fetch_add(1, Ordering::SeqCst);
                "first"
            })
        }));
        eprintln!(
            "block_on under the cap: {:?}",
            first
                .as_ref()
                .map_err(|p| crate::common::panic_message(&**p))
        );
        uncap_threads();
        // The caller saw a panic and does the work again, once.
        let r = runs.clone();
        let again = s.block_on(move || {
            r.fetch_add(1, Ordering::SeqCst);
            "again"
        });
        s.stop();
        let n = runs.load(Ordering::SeqCst);
        eprintln!("retried block_on: {again:?}; the closures ran {n} times in all");
        match first {
            Ok(v) => assert_eq!((v, n), ("first", 2)),
            Err(_) => assert_eq!(
                n, 1,
                "block_on panicked (its start was refused), yet its closure ran later, detached: \
                 the work was done twice"
            ),
        }
    });
}

// ============================================= 5. a partly bad iovec array

/// `writev`, `sendmsg` and `recvmsg` (plain and `MSG_WAITALL`) on a blocking stream socket
/// with two buffers, the first valid, the second unmapped: (result, errno set to 0 before
/// the call, what the peer got or what is left to read).
#[cfg(feature = "hook")]
fn partly_bad_iovec_unix() -> Vec<(isize, i32, Vec<u8>)> {
    partly_bad_iovec(|| {
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        (a.into(), b.into())
    })
}

#[cfg(feature = "hook")]
fn partly_bad_iovec_tcp() -> Vec<(isize, i32, Vec<u8>)> {
    partly_bad_iovec(|| {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let a = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let b = l.accept().unwrap().0;
        (a.into(), b.into())
    })
}

#[cfg(feature = "hook")]
fn partly_bad_iovec(
    pair: fn() -> (std::os::fd::OwnedFd, std::os::fd::OwnedFd),
) -> Vec<(isize, i32, Vec<u8>)> {
    let mut out = Vec::new();
    let bad = crate::common::unmapped_page();
    let set0 = || {
        // SAFETY: the thread's errno.
        unsafe { *libc::__errno_location() = 0 }
    };
    for which in 0..4 {
        let (a, b) = pair();
        let (a, b) = (std::fs::File::from(a), std::fs::File::from(b));
        let mut good = *b"abcd";
        let iov = [
            libc::iovec {
                iov_base: good.as_mut_ptr().cast(),
                iov_len: 4,
            },
            libc::iovec {
                iov_base: bad,
                iov_len: 4,
            },
        ];
        // SAFETY: an all-zero msghdr is valid.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = iov.as_ptr().cast_mut();
        msg.msg_iovlen = 2;
        let (r, e) = match which {
            0 | 1 => {
                set0();
                // SAFETY: the kernel checks the buffers.
                let r = unsafe {
                    if which == 0 {
                        libc::writev(a.as_raw_fd(), iov.as_ptr(), 2)
                    } else {
                        libc::sendmsg(a.as_raw_fd(), &msg, 0)
                    }
                };
                (r, errno())
            }
            _ => {
                (&b).write_all(b"12345678").unwrap();
                let flags = if which == 3 { libc::MSG_WAITALL } else { 0 };
                set0();
                // SAFETY: as above.
                let r = unsafe { libc::recvmsg(a.as_raw_fd(), &mut msg, flags) };
                (r, errno())
            }
        };
        drop(a);
        let mut rest = Vec::new();
        if which < 2 {
            (&b).read_to_end(&mut rest).unwrap();
        } else {
            rest.extend_from_slice(&good);
            rest.push(b'|');
            // What the receive left in the socket.
        }
        out.push((r, e, rest));
    }
    // SAFETY: ours.
    unsafe { libc::munmap(bad, 4096) };
    out
}

/// A fiber and a plain thread get the same result and errno from `writev`/`sendmsg`/
/// `recvmsg` with a partly bad iovec array on a blocking socket.
#[cfg(feature = "hook")]
#[test]
fn a_partly_bad_iovec_gets_what_libc_gives() {
    let (mut fib, mut plain) = crate::common::both(partly_bad_iovec_unix);
    let (f2, p2) = crate::common::both(partly_bad_iovec_tcp);
    fib.extend(f2);
    plain.extend(p2);
    eprintln!("fiber: {fib:?}\nplain: {plain:?}");
    let names = [
        "unix writev",
        "unix sendmsg",
        "unix recvmsg",
        "unix recvmsg MSG_WAITALL",
        "tcp writev",
        "tcp sendmsg",
        "tcp recvmsg",
        "tcp recvmsg MSG_WAITALL",
    ];
    let diff: Vec<String> = names
        .iter()
        .zip(fib.iter().zip(&plain))
        .filter(|(_, (f, p))| f != p)
        .map(|(n, (f, p))| format!("{n}: fiber {f:?}, libc {p:?}"))
        .collect();
    assert!(diff.is_empty(), "ERRORS: {}", diff.join(" || "));
}

// ===================================================================== 4. JoinSet

/// Thousands of tasks finishing at once on 2 workers, drained by `join_next` in one fiber
/// that a second fiber cancels midway; a third fiber goes on with the same set (behind a
/// `fibra::sync::Mutex`). Every result comes out exactly once over the two drainers.
#[test]
fn join_set_drained_across_a_cancelled_drainer_returns_each_result_once() {
    const N: usize = 3000;
    crate::common::with_deadline(|| {
        let s = crate::common::shared_started(2);
        let gate = Arc::new(fibra::sync::Semaphore::new(0));
        let mut set = fibra::JoinSet::new();
        for i in 0..N {
            let g = gate.clone();
            set.spawn_on(&s, move || {
                g.acquire().forget();
                i
            });
        }
        let set = Arc::new(fibra::sync::Mutex::new(set));
        let seen = Arc::new(std::sync::Mutex::new(vec![0u32; N]));
        let drain = |set: Arc<fibra::sync::Mutex<fibra::JoinSet<usize>>>,
                     seen: Arc<std::sync::Mutex<Vec<u32>>>| {
            move || {
                let mut g = set.lock().unwrap_or_else(|p| p.into_inner());
                while let Some(r) = g.join_next() {
                    let i = r.expect("a task failed");
                    seen.lock().unwrap()[i] += 1;
                    fibra::Fiber::yield_now();
                }
            }
        };
        let first = Arc::new(s.submit(drain(set.clone(), seen.clone()), None).unwrap());
        gate.release(N);
        let f = first.clone();
        let seen2 = seen.clone();
        let canceller = s
            .submit(
                move || {
                    while seen2.lock().unwrap().iter().sum::<u32>() < (N / 3) as u32 {
                        fibra::sleep(Duration::from_micros(100));
                    }
                    f.cancel();
                },
                None,
            )
            .unwrap();
        crate::common::finish(canceller);
        assert!(first.wait_timeout(LIMIT));
        let second = s.submit(drain(set.clone(), seen.clone()), None).unwrap();
        crate::common::finish(second);
        let seen = seen.lock().unwrap();
        let missing: Vec<usize> = (0..N).filter(|&i| seen[i] == 0).collect();
        let twice: Vec<usize> = (0..N).filter(|&i| seen[i] > 1).collect();
        assert!(
            missing.is_empty() && twice.is_empty(),
            "missing {missing:?}, twice {twice:?} (first drainer cancelled: {})",
            first.is_cancelled()
        );
        s.stop();
    });
}

/// `try_join_next` looped from a plain thread while thousands of tasks finish on 2
/// workers: it never blocks (each call returns within 100 ms) and returns each result once.
#[test]
fn try_join_next_from_a_plain_thread_never_blocks_and_returns_each_once() {
    const N: usize = 3000;
    crate::common::with_deadline(|| {
        let s = crate::common::shared_started(2);
        let gate = Arc::new(fibra::sync::Semaphore::new(0));
        let mut set = fibra::JoinSet::new();
        for i in 0..N {
            let g = gate.clone();
            set.spawn_on(&s, move || {
                g.acquire().forget();
                i
            });
        }
        gate.release(N);
        let mut seen = vec![0u32; N];
        let mut got = 0;
        let mut slowest = Duration::ZERO;
        let give_up = Instant::now() + LIMIT;
        while got < N && Instant::now() < give_up {
            let t0 = Instant::now();
            let r = set.try_join_next();
            slowest = slowest.max(t0.elapsed());
            if let Some(r) = r {
                seen[r.unwrap()] += 1;
                got += 1;
            }
        }
        assert!(set.try_join_next().is_none());
        let bad: Vec<usize> = (0..N).filter(|&i| seen[i] != 1).collect();
        assert!(
            bad.is_empty() && slowest < Duration::from_millis(100),
            "not once: {bad:?}; slowest call {slowest:?}"
        );
        s.stop();
    });
}
