//! Signal storms aimed at fibra's own threads (workers and the blocking pool, found by
//! name) while fibers and plain threads wait in fibra's own API; descriptor exhaustion with
//! the limit raised again afterwards; fds closed, shut down and duplicated over while
//! fibers wait on them. Everything that changes process-wide state (signal dispositions,
//! RLIMIT_NOFILE, fds closed behind fibra's back) runs in a child process (`in_child`).

use std::io::{ErrorKind, Read, Write};
use std::net::Shutdown;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{child_ok, LIMIT};
use fibra::Scheduler;

// ================================================================ 1. signals

static HANDLED: AtomicUsize = AtomicUsize::new(0);

extern "C" fn on_signal(_: libc::c_int) {
    // SAFETY: errno's location is the thread's own.
    let saved = unsafe { *libc::__errno_location() };
    HANDLED.fetch_add(1, Ordering::Relaxed);
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = saved };
}

/// Thread ids of this process whose name starts with `prefix` (from /proc/self/task/*/comm).
fn tids_named(prefix: &str) -> Vec<i32> {
    let mut out = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/proc/self/task") {
        for e in dir.flatten() {
            let Ok(tid) = e.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            if let Ok(comm) = std::fs::read_to_string(e.path().join("comm")) {
                if comm.trim_end().starts_with(prefix) {
                    out.push(tid);
                }
            }
        }
    }
    out
}

/// A thread that, until `stop`, signals every thread named `fibra*` (workers, pool) and the
/// threads in `extra` with SIGUSR1 and SIGALRM, every ~100 µs. Returns the signals sent.
fn storm(
    stop: Arc<AtomicBool>,
    extra: Arc<std::sync::Mutex<Vec<i32>>>,
) -> std::thread::JoinHandle<usize> {
    std::thread::spawn(move || {
        let mut sent = 0usize;
        let mut round = 0usize;
        while !stop.load(Ordering::Relaxed) {
            let mut tids = if round.is_multiple_of(20) || round < 5 {
                tids_named("fibra")
            } else {
                Vec::new()
            };
            // Re-read the names only now and then (reading /proc is slow); in between aim at
            // the threads seen last.
            thread_local! { static LAST: std::cell::RefCell<Vec<i32>> = const { std::cell::RefCell::new(Vec::new()) }; }
            if tids.is_empty() {
                tids = LAST.with(|l| l.borrow().clone());
            } else {
                LAST.with(|l| *l.borrow_mut() = tids.clone());
            }
            tids.extend(extra.lock().unwrap().iter().copied());
            let sig = if round.is_multiple_of(2) {
                libc::SIGUSR1
            } else {
                libc::SIGALRM
            };
            for t in tids {
                crate::common::tgkill(t, sig);
                sent += 1;
            }
            round += 1;
            crate::common::block_thread(Duration::from_micros(100));
        }
        sent
    })
}

const T: Duration = Duration::from_millis(150);

fn timed(what: &str, took: Duration) -> Result<(), String> {
    if took < T || took > Duration::from_secs(15) {
        return Err(format!("{what}: took {took:?}, expected >= {T:?}"));
    }
    Ok(())
}

fn err_s<E: std::fmt::Debug>(what: &str) -> impl FnOnce(E) -> String + '_ {
    move |e| format!("{what}: {e:?}")
}

/// One wait in a fiber, through fibra's own API, by number; each ends when its peer acts
/// (T later) or at its timeout, never with EINTR, never early.
fn fibra_wait(kind: usize, dir: &std::path::Path) -> Result<(), String> {
    use fibra::net::{TcpListener, TcpStream, UdpSocket};
    let t0 = Instant::now();
    match kind {
        0 => {
            // TcpStream read woken by the peer after T.
            let l = TcpListener::bind("127.0.0.1:0").map_err(err_s("bind"))?;
            let a = l.local_addr().unwrap();
            let peer = fibra::spawn(move || {
                let mut c = TcpStream::connect(a).unwrap();
                fibra::sleep(T);
                c.write_all(b"x").unwrap();
                c
            });
            let (mut s, _) = l.accept().map_err(err_s("accept"))?;
            let mut b = [0u8; 1];
            let r = s.read(&mut b).map_err(|e| (e.kind(), e.raw_os_error()));
            let took = t0.elapsed();
            drop(peer.join().unwrap());
            if r != Ok(1) {
                return Err(format!("tcp read: {r:?}"));
            }
            timed("tcp read", took)
        }
        1 => {
            // TcpStream write_all of 8 MiB that the peer drains only after T.
            let l = TcpListener::bind("127.0.0.1:0").map_err(err_s("bind"))?;
            let a = l.local_addr().unwrap();
            let peer = fibra::spawn(move || {
                let mut c = TcpStream::connect(a).unwrap();
                fibra::sleep(T);
                let mut n = 0usize;
                let mut buf = vec![0u8; 65536];
                while n < 8 << 20 {
                    match c.read(&mut buf) {
                        Ok(0) => break,
                        Ok(k) => n += k,
                        Err(e) => return Err(format!("drain: {e:?}")),
                    }
                }
                Ok(n)
            });
            let (mut s, _) = l.accept().map_err(err_s("accept"))?;
            let r = s
                .write_all(&vec![7u8; 8 << 20])
                .map_err(|e| format!("{e:?}"));
            let took = t0.elapsed();
            let got = peer.join().unwrap();
            if r.is_err() || got != Ok(8 << 20) {
                return Err(format!("tcp write_all: {r:?}, peer {got:?}"));
            }
            timed("tcp write_all", took)
        }
        2 => {
            // accept woken by a connect T later; the connect itself waits in the reactor.
            let l = TcpListener::bind("127.0.0.1:0").map_err(err_s("bind"))?;
            let a = l.local_addr().unwrap();
            let peer = fibra::spawn(move || {
                fibra::sleep(T);
                TcpStream::connect(a)
                    .map(drop)
                    .map_err(|e| format!("{e:?}"))
            });
            let r = l.accept().map(drop).map_err(|e| format!("{e:?}"));
            let took = t0.elapsed();
            let c = peer.join().unwrap();
            if r.is_err() || c.is_err() {
                return Err(format!("accept {r:?} / connect {c:?}"));
            }
            timed("accept", took)
        }
        3 => {
            // UdpSocket recv_from with a read timeout.
            let u = UdpSocket::bind("127.0.0.1:0").map_err(err_s("udp bind"))?;
            u.set_read_timeout(Some(T)).unwrap();
            let r = u.recv_from(&mut [0u8; 8]).map_err(|e| e.kind());
            if !matches!(r, Err(ErrorKind::WouldBlock | ErrorKind::TimedOut)) {
                return Err(format!("udp recv_from timeout: {r:?}"));
            }
            timed("udp recv_from timeout", t0.elapsed())
        }
        4 => {
            // UdpSocket recv woken by a datagram T later.
            let u = UdpSocket::bind("127.0.0.1:0").map_err(err_s("udp bind"))?;
            let a = u.local_addr().unwrap();
            let peer = fibra::spawn(move || {
                let o = UdpSocket::bind("127.0.0.1:0").unwrap();
                fibra::sleep(T);
                o.send_to(b"d", a).unwrap();
            });
            let r = u
                .recv_from(&mut [0u8; 8])
                .map(|(n, _)| n)
                .map_err(|e| e.kind());
            let took = t0.elapsed();
            peer.join().unwrap();
            if r != Ok(1) {
                return Err(format!("udp recv_from: {r:?}"));
            }
            timed("udp recv_from", took)
        }
        5 => {
            // UnixStream read woken after T.
            let (mut a, mut b) = fibra::net::unix::UnixStream::pair().map_err(err_s("pair"))?;
            let peer = fibra::spawn(move || {
                fibra::sleep(T);
                b.write_all(b"u").unwrap();
                b
            });
            let r = a.read(&mut [0u8; 4]).map_err(|e| e.kind());
            let took = t0.elapsed();
            drop(peer.join().unwrap());
            if r != Ok(1) {
                return Err(format!("unix read: {r:?}"));
            }
            timed("unix read", took)
        }
        6 => {
            fibra::sleep(T);
            timed("fibra::sleep", t0.elapsed())
        }
        7 => {
            let (_tx, rx) = fibra::sync::mpsc::channel::<u8>();
            let r = rx.recv_timeout(T);
            if r.is_ok() {
                return Err(format!("recv_timeout: {r:?}"));
            }
            timed("mpsc recv_timeout", t0.elapsed())
        }
        8 => {
            let m = Arc::new(fibra::sync::Mutex::new(0u32));
            let g = m.lock().unwrap();
            let m2 = m.clone();
            let waiter = fibra::spawn(move || {
                let t = Instant::now();
                *m2.lock().unwrap() += 1;
                t.elapsed()
            });
            fibra::sleep(T);
            drop(g);
            let took = waiter.join().unwrap();
            if *m.lock().unwrap() != 1 || took > Duration::from_secs(15) {
                return Err(format!("mutex: took {took:?}"));
            }
            Ok(())
        }
        9 => {
            let inner = fibra::unblock(|| {
                let t = Instant::now();
                std::thread::sleep(T);
                t.elapsed()
            });
            timed("unblock(thread::sleep) inside", inner)?;
            timed("unblock", t0.elapsed())
        }
        10 => {
            // fibra::fs write and read back, 1 MiB, on the pool.
            static N: AtomicUsize = AtomicUsize::new(0);
            let name = dir.join(format!("f-{}", N.fetch_add(1, Ordering::Relaxed)));
            let data: Vec<u8> = (0..1 << 20).map(|i| (i % 251) as u8).collect();
            fibra::fs::write(&name, &data).map_err(err_s("fs write"))?;
            let back = fibra::fs::read(&name).map_err(err_s("fs read"))?;
            let mut f = fibra::fs::File::open(&name).map_err(err_s("fs open"))?;
            let mut buf = Vec::new();
            f.read_to_end(&mut buf).map_err(err_s("fs read_to_end"))?;
            let _ = std::fs::remove_file(&name);
            if back != data || buf != data {
                return Err("fs: data differs".into());
            }
            Ok(())
        }
        11 => {
            // TcpStream read with a read timeout and no data.
            let l = TcpListener::bind("127.0.0.1:0").map_err(err_s("bind"))?;
            let a = l.local_addr().unwrap();
            let c = TcpStream::connect(a).map_err(err_s("connect"))?;
            let (s, _) = l.accept().map_err(err_s("accept"))?;
            s.set_read_timeout(Some(T)).unwrap();
            let t0 = Instant::now();
            let r = (&s).read(&mut [0u8; 4]).map_err(|e| e.kind());
            drop(c);
            if !matches!(r, Err(ErrorKind::WouldBlock | ErrorKind::TimedOut)) {
                return Err(format!("tcp read timeout: {r:?}"));
            }
            timed("tcp read timeout", t0.elapsed())
        }
        #[cfg(feature = "hook")]
        12 => {
            // std::net in a fiber (hooked): read woken after T, accept woken after T.
            let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(err_s("std bind"))?;
            let a = l.local_addr().unwrap();
            let peer = fibra::spawn(move || {
                std::thread::sleep(T);
                let mut c = std::net::TcpStream::connect(a).unwrap();
                std::thread::sleep(T);
                c.write_all(b"s").unwrap();
                c
            });
            let (mut s, _) = l.accept().map_err(err_s("std accept"))?;
            let took_accept = t0.elapsed();
            let r = s
                .read(&mut [0u8; 4])
                .map_err(|e| (e.kind(), e.raw_os_error()));
            let took = t0.elapsed();
            drop(peer.join().unwrap());
            if r != Ok(1) {
                return Err(format!("std read: {r:?}"));
            }
            timed("std accept", took_accept)?;
            if took < 2 * T {
                return Err(format!("std read early: {took:?}"));
            }
            Ok(())
        }
        #[cfg(feature = "hook")]
        13 => {
            std::thread::sleep(T);
            timed("std::thread::sleep (hooked)", t0.elapsed())?;
            let name = dir.join(format!("std-{}", t0.elapsed().as_nanos()));
            std::fs::write(&name, vec![1u8; 1 << 20]).map_err(err_s("std fs write"))?;
            let back = std::fs::read(&name).map_err(err_s("std fs read"))?;
            let _ = std::fs::remove_file(&name);
            if back.len() != 1 << 20 {
                return Err("std fs: short".into());
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

const KINDS: usize = 14;

fn signal_storm(restart: bool) {
    let disarm =
        crate::common::child_watchdog(Duration::from_secs(50), "CHILD HUNG (signal storm)");
    crate::common::install_signal(libc::SIGUSR1, restart, on_signal);
    crate::common::install_signal(libc::SIGALRM, restart, on_signal);
    let dir = std::env::temp_dir().join(format!("fibra-sigfd-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let s = Arc::new(
        Scheduler::builder()
            .threads(2)
            .name("fibra-w")
            .build()
            .unwrap(),
    );
    s.start();
    let stop = Arc::new(AtomicBool::new(false));
    let extra = Arc::new(std::sync::Mutex::new(Vec::new()));
    let storm_h = storm(stop.clone(), extra.clone());
    let fibers: Vec<_> = (0..2 * KINDS)
        .map(|i| {
            let dir = dir.clone();
            s.submit(
                move || -> Result<(), String> {
                    for _ in 0..3 {
                        fibra_wait(i % KINDS, &dir)?;
                    }
                    Ok(())
                },
                None,
            )
            .unwrap()
        })
        .collect();
    // Plain threads, themselves in the storm: join of a sleeping fiber, block_on, fibra::net
    // outside a fiber, JoinHandle::wait_timeout.
    let mut plain: Vec<std::thread::JoinHandle<Result<(), String>>> = Vec::new();
    for k in 0..4 {
        let s = s.clone();
        let extra = extra.clone();
        plain.push(std::thread::spawn(move || {
            extra.lock().unwrap().push(crate::common::gettid());
            for _ in 0..3 {
                let t0 = Instant::now();
                match k {
                    0 => {
                        let h = s.submit(|| fibra::sleep(T), None).unwrap();
                        h.join().map_err(|e| format!("join: {e:?}"))?;
                        timed("plain join", t0.elapsed())?;
                    }
                    1 => {
                        s.block_on(|| fibra::sleep(T));
                        timed("block_on", t0.elapsed())?;
                    }
                    2 => {
                        let l = fibra::net::TcpListener::bind("127.0.0.1:0").unwrap();
                        let a = l.local_addr().unwrap();
                        let peer = s
                            .submit(
                                move || {
                                    fibra::sleep(T);
                                    let mut c = fibra::net::TcpStream::connect(a).unwrap();
                                    c.write_all(b"p").unwrap();
                                    fibra::sleep(T);
                                },
                                None,
                            )
                            .unwrap();
                        let (mut srv, _) = l.accept().map_err(err_s("plain accept"))?;
                        let r = srv.read(&mut [0u8; 2]).map_err(|e| format!("{e:?}"));
                        peer.join().unwrap();
                        if r != Ok(1) {
                            return Err(format!("plain thread fibra::net read: {r:?}"));
                        }
                        timed("plain accept+read", t0.elapsed())?;
                    }
                    _ => {
                        let h = s.submit(|| fibra::sleep(3 * T), None).unwrap();
                        if h.wait_timeout(T) {
                            return Err(format!(
                                "wait_timeout(T) true early after {:?}",
                                t0.elapsed()
                            ));
                        }
                        timed("wait_timeout", t0.elapsed())?;
                        if !h.wait_timeout(LIMIT) {
                            return Err("wait_timeout(LIMIT) false".into());
                        }
                    }
                }
            }
            Ok(())
        }));
    }
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
    for (i, t) in plain.drain(..).enumerate() {
        match t.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => errs.push(format!("plain thread {i}: {e}")),
            Err(_) => errs.push(format!("plain thread {i} panicked")),
        }
    }
    // Every worker still runs; a second scheduler is stopped in the storm while its fibers
    // sleep.
    crate::common::every_worker_runs(&s);
    let s2 = Scheduler::builder()
        .threads(2)
        .name("fibra-x")
        .build()
        .unwrap();
    s2.start();
    let sleepers: Vec<_> = (0..20)
        .map(|_| s2.submit(|| fibra::sleep(T), None).unwrap())
        .collect();
    let t0 = Instant::now();
    s2.stop();
    let took = t0.elapsed();
    if took > Duration::from_secs(15) {
        errs.push(format!("stop took {took:?}"));
    }
    for h in sleepers {
        if !h.is_finished() {
            errs.push("a sleeper not finished after stop".into());
        }
    }
    stop.store(true, Ordering::Relaxed);
    let sent = storm_h.join().unwrap();
    let handled = HANDLED.load(Ordering::Relaxed);
    eprintln!("{sent} signals sent, {handled} handled");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(errs.is_empty(), "ERRORS: {}", errs.join(" || "));
    assert!(handled > 1000, "only {handled} signals handled");
    s.stop();
    disarm.store(true, Ordering::SeqCst);
}

/// SIGUSR1/SIGALRM without SA_RESTART aimed at every worker, pool thread and waiting plain
/// thread while fibers wait in fibra::net (TCP read/write/accept/connect, UDP, Unix), sleep,
/// timeouts, mpsc, Mutex, unblock, fibra::fs (and hooked std calls with `hook`), and plain
/// threads in join / block_on / wait_timeout / fibra::net: no EINTR, no early return, no hang,
/// no dead worker; `stop` in the storm ends.
#[test]
fn signal_storm_on_fibra_threads_without_restart() {
    child_ok(|| signal_storm(false));
}

/// The same storm with SA_RESTART.
#[test]
fn signal_storm_on_fibra_threads_with_restart() {
    child_ok(|| signal_storm(true));
}

// ================================================================ 2. descriptors

fn set_nofile_cur(n: u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: valid pointers.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        lim.rlim_cur = n.min(lim.rlim_max);
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
    }
}

/// The highest open fd.
fn max_fd() -> i32 {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<i32>().ok())
        .max()
        .unwrap()
}

fn is_emfile(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE) | Some(libc::ENFILE))
}

/// The limit lowered to the fds open now, before fibra ever made its reactor: the first
/// registrations fail (no epoll instance can be made), every call says EMFILE, fibers in
/// accept loops back off without spinning; the limit raised again (no fd freed), the very same
/// listener accepts the connection that waited meanwhile, and everything works, including a
/// second scheduler and fds numbered above the old limit. `submit` after `stop` hands the
/// closure back.
#[test]
fn emfile_by_a_lowered_limit_then_raised_again() {
    child_ok(|| {
        let disarm =
            crate::common::child_watchdog(Duration::from_secs(50), "CHILD HUNG (emfile raise)");
        set_nofile_cur(1024);
        let s = Arc::new(Scheduler::builder().threads(2).build().unwrap());
        s.start();
        // A std listener made now (no reactor yet), handed to fibra inside the fiber.
        let std_l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = std_l.local_addr().unwrap();
        // SAFETY: plain socket call; connected after the limit is lowered.
        let client = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) };
        assert!(client >= 0);
        let (lowered_tx, lowered_rx) = std::sync::mpsc::channel::<()>();
        let (raised_tx, raised_rx) = std::sync::mpsc::channel::<()>();
        let raised_flag = Arc::new(AtomicBool::new(false));
        let rf = raised_flag.clone();
        let acceptor = s
            .submit(
                move || -> Result<String, String> {
                    lowered_rx.recv().unwrap();
                    let l = fibra::net::TcpListener::from(std_l);
                    // Each call: EMFILE (the accepted socket, or the reactor, cannot be made).
                    let mut fails = 0usize;
                    let t0 = Instant::now();
                    while !rf.load(Ordering::SeqCst) {
                        match l.accept() {
                            Err(e) if is_emfile(&e) => {
                                fails += 1;
                                fibra::sleep(Duration::from_millis(10));
                            }
                            Ok(_) if rf.load(Ordering::SeqCst) => break,
                            other => return Err(format!("accept under EMFILE: {other:?}")),
                        }
                        if t0.elapsed() > LIMIT {
                            return Err("never raised".into());
                        }
                    }
                    // Raised: the pending connection is taken, with no new event.
                    let t1 = Instant::now();
                    let (mut c, _) = l
                        .accept()
                        .map_err(|e| format!("accept after raise: {e:?}"))?;
                    let took = t1.elapsed();
                    let mut b = [0u8; 2];
                    c.read_exact(&mut b).map_err(|e| format!("read: {e:?}"))?;
                    Ok(format!(
                        "{fails} EMFILE; accepted after raise in {took:?}: {b:?}"
                    ))
                },
                None,
            )
            .unwrap();
        // Lower the limit to what is open now: the next fd is refused.
        let n = max_fd() as u64 + 1;
        set_nofile_cur(n);
        // Holes below the highest fd are filled too.
        let mut holes = Vec::new();
        while let Ok(f) = std::fs::File::open("/dev/null") {
            holes.push(f);
        }
        let first = std::fs::File::open("/dev/null");
        assert!(first.as_ref().is_err_and(is_emfile), "not full: {first:?}");
        lowered_tx.send(()).unwrap();
        // The client connects now (no new fd: the socket exists); it waits in the backlog.
        let r = crate::common::raw_connect(client, addr);
        assert_eq!(r, 0, "client connect: {}", std::io::Error::last_os_error());
        // SAFETY: two bytes from a static buffer.
        assert_eq!(unsafe { libc::write(client, b"ok".as_ptr().cast(), 2) }, 2);
        // Meanwhile every fd path of fibra says EMFILE, on the first registration too.
        let report = s.block_on(move || {
            let mut r = Vec::new();
            let mut check = |what: &str, res: std::io::Result<()>| match &res {
                Err(e) if is_emfile(e) => {}
                other => r.push(format!("{what}: {other:?}")),
            };
            check("connect", fibra::net::TcpStream::connect(addr).map(drop));
            check("udp", fibra::net::UdpSocket::bind("127.0.0.1:0").map(drop));
            check("unix pair", fibra::net::unix::UnixStream::pair().map(drop));
            check(
                "fs open",
                fibra::fs::File::open("/proc/self/status").map(drop),
            );
            if fibra::unblock(|| 5) != 5 {
                r.push("unblock".into());
            }
            let sleepers: Vec<_> = (0..50)
                .map(|i| fibra::spawn(move || fibra::sleep(Duration::from_millis(1 + i % 5))))
                .collect();
            for h in sleepers {
                h.join().unwrap();
            }
            r
        });
        assert!(report.is_empty(), "not EMFILE: {report:?}");
        std::thread::sleep(Duration::from_millis(200));
        // Raise it again, freeing nothing: fds above the old limit are handed out.
        set_nofile_cur(4096);
        raised_flag.store(true, Ordering::SeqCst);
        drop(raised_tx);
        drop(raised_rx);
        assert!(acceptor.wait_timeout(LIMIT), "the acceptor never ended");
        let got = acceptor.join().unwrap();
        eprintln!("{got:?}");
        let got = got.unwrap();
        assert!(got.contains("[111, 107]"), "{got}");
        // Everything works, with fds numbered past the old limit.
        let mut hold = Vec::new();
        for _ in 0..300 {
            hold.push(std::fs::File::open("/dev/null").unwrap());
        }
        let ok = s.block_on(move || {
            let l = fibra::net::TcpListener::bind("127.0.0.1:0").unwrap();
            assert!(
                l.as_raw_fd() as u64 > n,
                "fd {} not above {n}",
                l.as_raw_fd()
            );
            let a = l.local_addr().unwrap();
            let c = fibra::spawn(move || {
                let mut c = fibra::net::TcpStream::connect(a).unwrap();
                c.write_all(b"hi").unwrap();
                let u = fibra::net::UdpSocket::bind("127.0.0.1:0").unwrap();
                u.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
                u.recv_from(&mut [0u8; 4]).is_err()
            });
            let (mut srv, _) = l.accept().unwrap();
            let mut b = [0u8; 2];
            srv.read_exact(&mut b).unwrap();
            let (mut p, mut q) = fibra::net::unix::UnixStream::pair().unwrap();
            p.write_all(b"u").unwrap();
            let mut one = [0u8; 1];
            q.read_exact(&mut one).unwrap();
            fibra::fs::read("/proc/self/status").unwrap();
            c.join().unwrap() && &b == b"hi" && one == *b"u"
        });
        assert!(ok);
        drop(hold);
        drop(holes);
        let s2 = Scheduler::builder().threads(1).build().unwrap();
        s2.start();
        assert_eq!(s2.block_on(|| 9), 9);
        s2.stop();
        // A refused closure comes back.
        let back = match s2.submit(|| 41, None) {
            Err(e) => e.into_inner(),
            Ok(_) => panic!("submit after stop accepted"),
        };
        assert_eq!(back(), 41);
        crate::common::every_worker_runs(&s);
        s.stop();
        disarm.store(true, Ordering::SeqCst);
    });
}

/// An accept loop with *no* back-off on a one-worker scheduler under EMFILE: the worker's
/// other fibers (the one that frees descriptors after a fibra::sleep, and a ticker) still
/// run, and the loop then accepts; for a Unix listener too.
#[test]
fn unix_accept_loop_without_backoff_under_emfile_does_not_livelock() {
    child_ok(|| {
        let disarm = crate::common::child_watchdog(
            Duration::from_secs(50),
            "CHILD HUNG (unix accept emfile)",
        );
        let s = Scheduler::builder().threads(1).build().unwrap();
        s.start();
        let dir = std::env::temp_dir().join(format!("fibra-sigfd-u-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join("sock");
        let l = fibra::net::unix::UnixListener::bind(&path).unwrap();
        // A connection made now, waiting in the backlog.
        let _c = std::os::unix::net::UnixStream::connect(&path).unwrap();
        // Make sure the reactor exists (a registration), then fill the table.
        let warm = s.block_on(|| {
            let (a, _b) = fibra::net::unix::UnixStream::pair().unwrap();
            a.set_read_timeout(Some(Duration::from_millis(1))).unwrap();
            (&a).read(&mut [0u8; 1]).is_err()
        });
        assert!(warm);
        let filler = Arc::new(std::sync::Mutex::new(crate::common::fill_descriptor_table(
            0,
        )));
        let f2 = filler.clone();
        let freer = s
            .submit(
                move || {
                    fibra::sleep(Duration::from_millis(300));
                    f2.lock().unwrap().clear();
                },
                None,
            )
            .unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let (ticks, ticker) = crate::common::ticker(&s, stop.clone(), Duration::from_millis(5));
        let acc = s
            .submit(
                move || {
                    let t0 = Instant::now();
                    let mut fails = 0u64;
                    loop {
                        match l.accept() {
                            Ok(_) => return Ok(fails),
                            Err(e) if is_emfile(&e) => fails += 1,
                            Err(e) => return Err(format!("{e:?}")),
                        }
                        if t0.elapsed() > LIMIT {
                            return Err(format!("still EMFILE after {fails} tries"));
                        }
                    }
                },
                None,
            )
            .unwrap();
        assert!(acc.wait_timeout(LIMIT), "accept loop never ended");
        let r = acc.join().unwrap();
        stop.store(true, Ordering::SeqCst);
        assert!(freer.wait_timeout(LIMIT));
        ticker.join().unwrap();
        eprintln!("{r:?}, {} ticks", ticks.load(Ordering::SeqCst));
        assert!(r.is_ok(), "{r:?}");
        assert!(ticks.load(Ordering::SeqCst) >= 5, "the ticker starved");
        drop(filler);
        s.stop();
        let _ = std::fs::remove_dir_all(&dir);
        disarm.store(true, Ordering::SeqCst);
    });
}

// ================================================================ 3. closed and reused fds

fn tcp_pair() -> (fibra::net::TcpStream, fibra::net::TcpStream) {
    let l = fibra::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let c = fibra::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (s, _) = l.accept().unwrap();
    (c, s)
}

/// shutdown(Both) from another fiber while one fiber reads and another writes into a full
/// buffer on the same TcpStream (and on a UnixStream): the reader gets EOF, the writer an
/// error, both promptly.
#[test]
fn shutdown_both_wakes_a_reader_and_a_writer_on_the_same_stream() {
    crate::common::with_deadline(|| {
        let s = crate::common::started(2);
        let r = crate::common::finish(
            s.submit(
                || {
                    let mut out = Vec::new();
                    for unix in [false, true] {
                        let (a, _b): (Arc<dyn Stream>, Box<dyn std::any::Any + Send>) = if unix {
                            let (a, b) = fibra::net::unix::UnixStream::pair().unwrap();
                            (Arc::new(a), Box::new(b))
                        } else {
                            let (a, b) = tcp_pair();
                            (Arc::new(a), Box::new(b))
                        };
                        let a2 = a.clone();
                        let reader = fibra::spawn(move || a2.read1());
                        let a3 = a.clone();
                        let writer = fibra::spawn(move || a3.write_lots());
                        fibra::sleep(Duration::from_millis(100));
                        let t0 = Instant::now();
                        a.shut();
                        let rr = reader.join().unwrap();
                        let wr = writer.join().unwrap();
                        out.push((unix, rr, wr, t0.elapsed()));
                    }
                    out
                },
                None,
            )
            .unwrap(),
        );
        for (unix, rr, wr, took) in r {
            assert_eq!(rr, Ok(0), "unix={unix}: reader after shutdown");
            assert!(wr.is_err(), "unix={unix}: writer after shutdown: {wr:?}");
            assert!(took < Duration::from_secs(10), "unix={unix}: took {took:?}");
        }
        s.stop();
    });
}

trait Stream: Send + Sync {
    fn read1(&self) -> Result<usize, ErrorKind>;
    fn write_lots(&self) -> Result<(), ErrorKind>;
    fn shut(&self);
}

macro_rules! stream_impl {
    ($t:ty) => {
        impl Stream for $t {
            fn read1(&self) -> Result<usize, ErrorKind> {
                let mut r = self;
                r.read(&mut [0u8; 16]).map_err(|e| e.kind())
            }
            fn write_lots(&self) -> Result<(), ErrorKind> {
                let mut w = self;
                let buf = vec![1u8; 1 << 20];
                for _ in 0..64 {
                    w.write_all(&buf).map_err(|e| e.kind())?;
                }
                Ok(())
            }
            fn shut(&self) {
                self.shutdown(Shutdown::Both).unwrap();
            }
        }
    };
}
stream_impl!(fibra::net::TcpStream);
stream_impl!(fibra::net::unix::UnixStream);

/// A fiber waits in `accept` on a `try_clone` of a listener while another fiber drops the
/// original; a connection then arrives: the clone accepts it. And a fiber reading on a
/// `try_clone` of a stream whose original is dropped meanwhile gets the peer's data.
#[test]
fn waiting_on_a_clone_whose_original_is_dropped() {
    crate::common::with_deadline(|| {
        let s = crate::common::started(2);
        let (a, b) = crate::common::finish(
            s.submit(
                || {
                    let l = fibra::net::TcpListener::bind("127.0.0.1:0").unwrap();
                    let addr = l.local_addr().unwrap();
                    let l2 = l.try_clone().unwrap();
                    let acc = fibra::spawn(move || l2.accept().map(|_| ()).map_err(|e| e.kind()));
                    fibra::sleep(Duration::from_millis(50));
                    drop(l);
                    fibra::sleep(Duration::from_millis(50));
                    let _c = fibra::net::TcpStream::connect(addr).unwrap();
                    let a = acc.join().unwrap();
                    let (x, y) = tcp_pair();
                    let x2 = x.try_clone().unwrap();
                    let rd = fibra::spawn(move || {
                        let mut b = [0u8; 4];
                        (&x2)
                            .read(&mut b)
                            .map(|n| b[..n].to_vec())
                            .map_err(|e| e.kind())
                    });
                    fibra::sleep(Duration::from_millis(50));
                    drop(x);
                    fibra::sleep(Duration::from_millis(50));
                    (&y).write_all(b"abc").unwrap();
                    (a, rd.join().unwrap())
                },
                None,
            )
            .unwrap(),
        );
        assert_eq!(a, Ok(()));
        assert_eq!(b, Ok(b"abc".to_vec()));
        s.stop();
    });
}

/// `shutdown(SHUT_RDWR)` on a fibra listener's fd from a plain thread (the usual way to stop
/// an accept loop) wakes the fiber waiting in accept with an error; `shutdown(SHUT_RD)` on a
/// connected fibra UdpSocket's fd wakes a fiber in recv.
#[test]
fn raw_shutdown_wakes_accept_and_udp_recv() {
    crate::common::with_deadline(|| {
        let s = crate::common::started(2);
        let l = Arc::new(fibra::net::TcpListener::bind("127.0.0.1:0").unwrap());
        let l2 = l.clone();
        let acc = s
            .submit(
                move || l2.accept().map(drop).map_err(|e| e.to_string()),
                None,
            )
            .unwrap();
        let u = Arc::new(fibra::net::UdpSocket::bind("127.0.0.1:0").unwrap());
        u.connect("127.0.0.1:9").unwrap();
        let u2 = u.clone();
        let rcv = s
            .submit(
                move || u2.recv(&mut [0u8; 8]).map_err(|e| e.to_string()),
                None,
            )
            .unwrap();
        // Both tasks may have started on either worker: wait for both waits, not for one
        // worker's park count.
        crate::common::parked_on_io(&s, 2);
        let t0 = Instant::now();
        // SAFETY: shutting down our own sockets.
        unsafe {
            libc::shutdown(l.as_raw_fd(), libc::SHUT_RDWR);
            libc::shutdown(u.as_raw_fd(), libc::SHUT_RD);
        }
        assert!(
            acc.wait_timeout(Duration::from_secs(10)),
            "accept not woken by shutdown"
        );
        assert!(
            rcv.wait_timeout(Duration::from_secs(10)),
            "udp recv not woken by shutdown"
        );
        let (a, r) = (acc.join().unwrap(), rcv.join().unwrap());
        eprintln!("accept {a:?}, recv {r:?} after {:?}", t0.elapsed());
        assert!(a.is_err(), "accept after shutdown: {a:?}");
        assert!(matches!(r, Ok(0) | Err(_)), "recv after shutdown: {r:?}");
        s.stop();
    });
}

/// `fibra::io::wait_readable` on pipes: the documented deregister-then-close from another
/// thread wakes the waiter, and a new pipe that reuses the number at once (written to right
/// away) is registered afresh and its own waiter sees its data, 300 times over.
#[test]
fn deregister_close_and_reuse_race_with_waiters() {
    crate::common::with_deadline(|| {
        let s = crate::common::shared_started(2);
        let mut slow = 0;
        for i in 0..300 {
            let mut p = [0i32; 2];
            // SAFETY: a valid array.
            assert_eq!(
                unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) },
                0
            );
            let (rfd, wfd) = (p[0], p[1]);
            let w = s
                .submit(
                    move || {
                        let t0 = Instant::now();
                        let r = fibra::io::wait_readable(rfd, Some(Duration::from_secs(20)));
                        (r.map_err(|e| e.kind()), t0.elapsed())
                    },
                    None,
                )
                .unwrap();
            if i % 2 == 0 {
                std::thread::sleep(Duration::from_micros(200));
            }
            fibra::io::deregister(rfd);
            // SAFETY: our own fds.
            unsafe {
                libc::close(rfd);
                libc::close(wfd);
            }
            // A new pipe, likely the same numbers; data in it at once.
            let mut q = [0i32; 2];
            // SAFETY: as above.
            assert_eq!(
                unsafe { libc::pipe2(q.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) },
                0
            );
            let w2 = s
                .submit(
                    move || {
                        let r = fibra::io::wait_readable(q[0], Some(Duration::from_secs(20)));
                        let mut b = [0u8; 1];
                        // SAFETY: a live buffer.
                        let n = unsafe { libc::read(q[0], b.as_mut_ptr().cast(), 1) };
                        (r.map_err(|e| e.kind()), n, b[0])
                    },
                    None,
                )
                .unwrap();
            // SAFETY: a static byte.
            assert_eq!(unsafe { libc::write(q[1], b"z".as_ptr().cast(), 1) }, 1);
            assert!(w.wait_timeout(LIMIT), "round {i}: the first waiter hung");
            let (r, took) = w.join().unwrap();
            // Ok (woken by the deregister, or it waited on the reused number, which became
            // readable) or EBADF (it began after the close): all fine, if prompt.
            if took > Duration::from_secs(5)
                || r.as_ref().is_err_and(|e| *e == ErrorKind::WouldBlock)
            {
                slow += 1;
                eprintln!("round {i}: first waiter {r:?} after {took:?}");
            }
            assert!(w2.wait_timeout(LIMIT), "round {i}: the second waiter hung");
            let (r2, n, byte) = w2.join().unwrap();
            assert_eq!((r2, n, byte), (Ok(()), 1, b'z'), "round {i}: second waiter");
            fibra::io::deregister(q[0]);
            // SAFETY: our own fds.
            unsafe {
                libc::close(q[0]);
                libc::close(q[1]);
            }
        }
        assert_eq!(slow, 0, "{slow} first waiters woke late or failed");
    });
}

/// With the hook: `close` on the fd of a `fibra::net::TcpStream` from a plain thread while a
/// fiber reads it. The README's hook table says a `close` wakes the fibers waiting on the
/// fd (with EBADF). The stream is leaked after (its fd is gone).
#[cfg(feature = "hook")]
#[test]
fn hooked_close_of_a_fibra_socket_wakes_its_reader() {
    let run = crate::common::in_child(|| {
        let disarm =
            crate::common::child_watchdog(Duration::from_secs(50), "CHILD HUNG (hooked close)");
        let s = crate::common::started(2);
        let (a, b) = s.block_on(tcp_pair);
        let a = Arc::new(a);
        let fd = a.as_raw_fd();
        // Bounded: the failure is a timeout, not a hang.
        // (FIBRA_SIGFD_UNBOUNDED set: no timeout, to look at the hang with gdb.)
        if std::env::var_os("FIBRA_SIGFD_UNBOUNDED").is_none() {
            a.set_read_timeout(Some(Duration::from_secs(8))).unwrap();
        }
        let a2 = a.clone();
        let rd = s
            .submit(
                move || {
                    let t0 = Instant::now();
                    let r = (&*a2)
                        .read(&mut [0u8; 4])
                        .map_err(|e| (e.kind(), e.raw_os_error()));
                    (r, t0.elapsed())
                },
                None,
            )
            .unwrap();
        // Time for the reader to park in its read.
        std::thread::sleep(Duration::from_millis(300));
        // SAFETY: closing behind the stream's back, as the hook documents for waiters.
        assert_eq!(unsafe { libc::close(fd) }, 0);
        assert!(rd.wait_timeout(LIMIT), "reader hung");
        let (r, took) = rd.join().unwrap();
        eprintln!("reader after close: {r:?} after {took:?}");
        assert_eq!(
            r.map_err(|e| e.1),
            Err(Some(libc::EBADF)),
            "the hook promises EBADF"
        );
        std::mem::forget(a);
        drop(b);
        assert!(
            took < Duration::from_secs(5),
            "the reader was not woken by close: {r:?} after {took:?}"
        );
        disarm.store(true, Ordering::SeqCst);
        eprintln!("CHILD OK");
        // SAFETY: leave at once (the leaked stream's fd is gone).
        unsafe { libc::_exit(0) };
    });
    // The body leaves with `_exit` before `in_child` can mark its end: its own line does.
    assert!(
        run.code() == Some(0) && run.stderr.contains("CHILD OK"),
        "the child ended with {:?} (signal {:?}) before the end of its body\n--- its stderr ---\n{}",
        run.status,
        run.signal(),
        run.stderr
    );
}

/// With the hook: a fiber reads a hooked std TcpStream; a plain thread `dup2`s another
/// connected socket, whose peer already sent "WRONG", over its fd. The reader must wake
/// (with an error or EOF) and never return the other socket's bytes.
#[cfg(feature = "hook")]
#[test]
fn dup2_over_a_read_fd_never_reads_the_other_socket() {
    child_ok(|| {
        let disarm = crate::common::child_watchdog(Duration::from_secs(50), "CHILD HUNG (dup2)");
        let s = crate::common::started(2);
        let mut wrong = 0;
        for round in 0..100 {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let a = l.local_addr().unwrap();
            let mine_peer = std::net::TcpStream::connect(a).unwrap();
            let (mine, _) = l.accept().unwrap();
            let mut other_peer = std::net::TcpStream::connect(a).unwrap();
            let (other, _) = l.accept().unwrap();
            other_peer.write_all(b"WRONG").unwrap();
            let mine = Arc::new(mine);
            let rd = dup2_under_a_parked_reader(&s, &mine, &other);
            if !rd.wait_timeout(Duration::from_secs(10)) {
                eprintln!("round {round}: reader hung after dup2");
                wrong += 1;
                // Wake it for good: the peer of the socket now at fd sends.
                drop(other_peer);
                let _ = rd.wait_timeout(LIMIT);
                break;
            }
            let r = rd.join().unwrap();
            if r.as_deref() == Ok(b"WRONG".as_slice()) {
                eprintln!("round {round}: read the other socket's bytes");
                wrong += 1;
            }
            drop(mine_peer);
            drop(other_peer);
            drop(other);
            // `mine` owns fd (now the duplicate): dropping it closes that.
            drop(mine);
        }
        assert_eq!(wrong, 0, "{wrong} rounds went wrong");
        drop(s);
        disarm.store(true, Ordering::SeqCst);
    });
}

/// A fiber of `s` reads (up to 8 bytes) from `stream`; once it is parked in that read,
/// `other`'s descriptor is `dup2`ed over the stream's. Returns the reader: the bytes it read,
/// or its `errno`. Only a reader parked in its read is the question: one that had not yet
/// called `read` at the `dup2` rightly reads the socket the fd names by then.
#[cfg(feature = "hook")]
fn dup2_under_a_parked_reader<T>(
    s: &Scheduler,
    stream: &Arc<T>,
    other: &std::net::TcpStream,
) -> fibra::JoinHandle<Result<Vec<u8>, Option<i32>>>
where
    T: AsRawFd + Send + Sync + 'static,
    for<'a> &'a T: Read,
{
    let fd = stream.as_raw_fd();
    let m2 = stream.clone();
    let rd = s
        .submit(
            move || {
                let mut b = [0u8; 8];
                (&*m2)
                    .read(&mut b)
                    .map(|n| b[..n].to_vec())
                    .map_err(|e| e.raw_os_error())
            },
            None,
        )
        .unwrap();
    wait_parked_on_io(s, rd.id());
    // SAFETY: replacing our own fd with a duplicate of our own socket.
    assert_eq!(unsafe { libc::dup2(other.as_raw_fd(), fd) }, fd);
    rd
}

/// Waits (bounded) until the fiber `id` of `s` is parked waiting for I/O.
#[cfg(feature = "hook")]
fn wait_parked_on_io(s: &fibra::Scheduler, id: fibra::FiberId) {
    let end = Instant::now() + LIMIT;
    while !s.dump().fibers().iter().any(|e| {
        e.id() == id
            && matches!(
                e.status(),
                fibra::dump::Status::Parked(fibra::dump::WaitOn::Io { .. })
            )
    }) {
        assert!(
            Instant::now() < end,
            "the reader never parked on its socket"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// With the hook: a fiber reads a `fibra::net::TcpStream`; a plain thread `dup2`s another
/// connected socket, whose peer already sent "WRONG", over the stream's fd. The stream's
/// registration goes, so the reader wakes with `EBADF` and never returns the other socket's
/// bytes; later calls on the stream fail the same way.
#[cfg(feature = "hook")]
#[test]
fn dup2_over_a_fibra_socket_fails_its_reader_with_ebadf() {
    child_ok(|| {
        let disarm = crate::common::child_watchdog(
            Duration::from_secs(50),
            "CHILD HUNG (dup2 fibra socket)",
        );
        let s = crate::common::started(2);
        for _ in 0..50 {
            let (mine, _mine_peer) = s.block_on(tcp_pair);
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let mut other_peer = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
            let (other, _) = l.accept().unwrap();
            other_peer.write_all(b"WRONG").unwrap();
            let mine = Arc::new(mine);
            let rd = dup2_under_a_parked_reader(&s, &mine, &other);
            assert!(rd.wait_timeout(LIMIT), "the reader hung after dup2");
            assert_eq!(rd.join().unwrap(), Err(Some(libc::EBADF)));
            let again = (&*mine).read(&mut [0u8; 8]).map_err(|e| e.raw_os_error());
            assert_eq!(
                again,
                Err(Some(libc::EBADF)),
                "a later read reached the other socket"
            );
            drop(other_peer);
            drop(other);
            // `mine` owns fd (now the duplicate): dropping it closes that.
            drop(mine);
        }
        drop(s);
        disarm.store(true, Ordering::SeqCst);
    });
}
