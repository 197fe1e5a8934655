//! Resource exhaustion: descriptors (EMFILE), threads (RLIMIT_NPROC for an unprivileged
//! uid), address space (RLIMIT_AS), timers, and bad pointers given to the hooked C calls.
//! Everything that changes a process-wide limit runs in a child process (`in_child`).

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{cap_threads, child_ok, errno, in_child, uncap_threads, LIMIT};
use fibra::Scheduler;

fn set_nofile(n: u64) {
    let lim = libc::rlimit {
        rlim_cur: n,
        rlim_max: n.max(20_000),
    };
    // SAFETY: a valid rlimit.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) }, 0);
}

fn is_emfile(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE) | Some(libc::ENFILE))
}

/// CPU time (user + system) of this process so far.
fn cpu_time() -> Duration {
    // SAFETY: a zeroed rusage filled by the kernel.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer.
    assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) }, 0);
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// The uids of the child tests that cap threads.
const START_UID: libc::uid_t = 61_721;
const POOL_UID: libc::uid_t = 61_722;
const STOP_UID: libc::uid_t = 61_723;
const EMPTY_POOL_UID: libc::uid_t = 61_724;

fn can_spawn_thread() -> bool {
    std::thread::Builder::new()
        .spawn(|| ())
        .map(|h| h.join().is_ok())
        .unwrap_or(false)
}

// ================================================================ 1. EMFILE

/// Every descriptor-making path of fibra with the table full: each returns EMFILE (no
/// panic, no dead worker), the scheduler keeps running fibers, and once descriptors come
/// back everything works again.
#[test]
fn emfile_at_every_fd_path_is_an_error_and_recovers() {
    child_ok(|| {
        set_nofile(256);
        // A listener made before the table fills, for connects.
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = std_listener.local_addr().unwrap();
        let dir = std::env::temp_dir().join(format!("fibra-exh-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let held = crate::common::fill_descriptor_table(0);
        eprintln!("holding {} fds", held.len());
        // Build and start with no descriptor left (the first, then a second scheduler).
        let s = Arc::new(Scheduler::builder().threads(2).build().expect("build"));
        s.start();
        let s2 = Scheduler::builder()
            .threads(1)
            .build()
            .expect("second build");
        s2.start();
        assert_eq!(s2.block_on(|| 5), 5);
        let d2 = dir.clone();
        let report = s.block_on(move || {
            let mut r = Vec::new();
            let mut check = |what: &str, res: std::io::Result<()>| match &res {
                Err(e) if is_emfile(e) => {}
                other => r.push(format!("{what}: {other:?}")),
            };
            check(
                "tcp bind",
                fibra::net::TcpListener::bind("127.0.0.1:0").map(drop),
            );
            check(
                "tcp connect",
                fibra::net::TcpStream::connect(addr).map(drop),
            );
            check(
                "udp bind",
                fibra::net::UdpSocket::bind("127.0.0.1:0").map(drop),
            );
            check("unix pair", fibra::net::unix::UnixStream::pair().map(drop));
            check(
                "unix bind",
                fibra::net::unix::UnixListener::bind(d2.join("l")).map(drop),
            );
            check(
                "unix datagram",
                fibra::net::unix::UnixDatagram::pair().map(drop),
            );
            check(
                "fs open",
                fibra::fs::File::open("/proc/self/status").map(drop),
            );
            check("fs read", fibra::fs::read("/proc/self/status").map(drop));
            assert_eq!(fibra::unblock(|| 7), 7);
            let sleepers: Vec<_> = (0..200)
                .map(|i| fibra::spawn(move || fibra::sleep(Duration::from_millis(1 + i % 7))))
                .collect();
            for h in sleepers {
                h.join().unwrap();
            }
            r
        });
        assert!(report.is_empty(), "not EMFILE: {report:#?}");
        // One and two descriptors free: the first registration needs the reactor's two.
        let mut held = held;
        for free in 1..=3 {
            drop(held.pop());
            let got = s.block_on(move || {
                let c = fibra::net::TcpStream::connect(addr);
                let pair = fibra::net::unix::UnixStream::pair();
                (
                    c.map(drop).map_err(|e| e.to_string()),
                    pair.map(drop).map_err(|e| e.to_string()),
                )
            });
            eprintln!("{free} free: connect {:?}, pair {:?}", got.0, got.1);
        }
        drop(held);
        // Everything works again, including waits on the reactor.
        let ok = s.block_on(move || {
            let l = fibra::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let a = l.local_addr().unwrap();
            let c = fibra::spawn(move || {
                let mut c = fibra::net::TcpStream::connect(a).unwrap();
                c.write_all(b"hi").unwrap();
            });
            let (mut srv, _) = l.accept().unwrap();
            let mut b = [0u8; 2];
            srv.read_exact(&mut b).unwrap();
            c.join().unwrap();
            fibra::fs::read("/proc/self/status").unwrap();
            &b == b"hi"
        });
        assert!(ok);
        drop(std_listener);
        let _ = std::fs::remove_dir_all(&dir);
    });
}

/// A connection waits in the backlog while the table is full: `accept` fails with EMFILE
/// (no spin meanwhile), and once descriptors are freed the same listener accepts it without
/// any new event (no lost wake-up).
#[test]
fn accept_after_emfile_takes_the_pending_connection() {
    child_ok(|| {
        set_nofile(256);
        let s = Arc::new(Scheduler::builder().threads(2).build().unwrap());
        s.start();
        let (tx, rx) = std::sync::mpsc::channel::<(Duration, Duration, String)>();
        let (free_tx, free_rx) = std::sync::mpsc::channel::<()>();
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        // Client socket made before the fill; it connects after.
        // SAFETY: plain socket call.
        let client = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) };
        assert!(client >= 0);
        let h = s.spawn(move || {
            let l = fibra::net::TcpListener::bind("127.0.0.1:0").unwrap();
            addr_tx.send(l.local_addr().unwrap()).unwrap();
            // Parked in accept while the table fills and the client connects.
            let first = l.accept().map(drop);
            let e = first.expect_err("accept with a full table");
            assert!(is_emfile(&e), "{e:?}");
            // A server's usual loop: back off and retry, for 300 ms.
            let (t0, c0) = (Instant::now(), cpu_time());
            let mut fails = 0;
            while t0.elapsed() < Duration::from_millis(300) {
                match l.accept() {
                    Err(e) if is_emfile(&e) => {
                        fails += 1;
                        fibra::sleep(Duration::from_millis(20));
                    }
                    other => panic!("accept under EMFILE: {other:?}"),
                }
            }
            let cpu = cpu_time() - c0;
            free_rx.recv().unwrap();
            let t1 = Instant::now();
            let got = l.accept().map(|(_, a)| a.to_string());
            tx.send((cpu, t1.elapsed(), format!("{fails} fails; then {got:?}")))
                .unwrap();
        });
        let addr = addr_rx.recv().unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let held = crate::common::fill_descriptor_table(0);
        let r = crate::common::raw_connect(client, addr);
        assert_eq!(r, 0, "client connect: {}", std::io::Error::last_os_error());
        std::thread::sleep(Duration::from_millis(400));
        drop(held);
        free_tx.send(()).unwrap();
        let (cpu, waited, what) = rx.recv_timeout(LIMIT).expect("the accept loop never ended");
        eprintln!("cpu {cpu:?} in 300 ms of EMFILE; accept after freeing took {waited:?}: {what}");
        assert!(what.contains("Ok("), "{what}");
        assert!(cpu < Duration::from_millis(150), "spun: {cpu:?}");
        h.join().unwrap();
    });
}

// ============================================================ 3. threads

/// `start` when the OS refuses the later worker threads (RLIMIT_NPROC for an unprivileged
/// uid) panics, as documented. But once threads can be had again the scheduler never gets
/// its missing workers: `start` is a no-op from then on (the phase already says running), a
/// task pinned to a missing worker is accepted by `submit` and never runs, and `stop`, which
/// waits for every task, never returns.
/// The OS refuses a worker thread in `start` (RLIMIT_NPROC for an unprivileged uid, so in
/// a child): `start` panics, saying which worker; the work pinned to the missing worker
/// waits, a second `start` spawns it once threads can be had, and the work runs. With the
/// threads still refused, `stop` ends and fails the missing worker's queued task.
#[test]
fn a_start_the_os_refuses_threads_can_be_retried_and_stopped() {
    child_ok(|| {
        let s = Arc::new(Scheduler::builder().threads(4).build().expect("build"));
        let s2 = Arc::new(Scheduler::builder().threads(4).build().expect("build"));
        cap_threads(START_UID, 2);
        let refused = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| s.start()));
        let msg = crate::common::panic_message(&*refused.expect_err("start under the cap panics"));
        assert!(
            msg.as_deref()
                .unwrap_or("")
                .contains("cannot spawn worker thread 2"),
            "{msg:?}"
        );
        let pinned = s.submit(|| 3, Some(3)).expect("submit before the retry");
        assert!(!pinned.wait_timeout(Duration::from_millis(100)));
        uncap_threads();
        s.start();
        assert_eq!(crate::common::finish(pinned), 3);
        let stopped = stop_in_background(&s);
        assert!(stopped.returned_within(LIMIT), "stop returned");

        // Refused again, and still refused when it stops (the stopping thread is made first).
        let (go, stop_now) = std::sync::mpsc::channel::<()>();
        let stopped = {
            let (tx, rx) = std::sync::mpsc::channel();
            let s2 = s2.clone();
            std::thread::spawn(move || {
                stop_now.recv().unwrap();
                s2.stop();
                let _ = tx.send(());
            });
            rx
        };
        cap_threads(START_UID, 2);
        let refused = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| s2.start()));
        assert!(refused.is_err());
        let pinned = s2.submit(|| 3, Some(3)).expect("submit");
        let anywhere = s2.spawn(|| 4);
        assert_eq!(
            crate::common::finish(anywhere),
            4,
            "the workers that started run"
        );
        go.send(()).unwrap();
        assert!(stopped.recv_timeout(LIMIT).is_ok(), "stop returned");
        assert!(pinned.join().unwrap_err().is_cancelled());
        uncap_threads();
    });
}

/// A fiber still finishing during `stop` submits a task pinned to a worker whose thread the
/// OS refused, after `stop` failed that worker's queue (fibers may submit while stopping):
/// the submit is refused, or its task fails as cancelled, and `stop` returns.
#[test]
fn pinned_submit_to_a_missing_worker_during_stop_does_not_hang_stop() {
    child_ok(|| {
        let s = Arc::new(Scheduler::builder().threads(4).build().expect("build"));
        // The stopping thread is made before the cap.
        let (go_stop, stop_now) = std::sync::mpsc::channel::<()>();
        let (stopped_tx, stopped) = std::sync::mpsc::channel::<()>();
        {
            let s = s.clone();
            std::thread::spawn(move || {
                stop_now.recv().unwrap();
                s.stop();
                let _ = stopped_tx.send(());
            });
        }
        cap_threads(STOP_UID, 2);
        let refused = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| s.start()));
        assert!(refused.is_err(), "start under the cap panics");
        let (tx, rx) = fibra::sync::oneshot::channel::<()>();
        let (htx, hrx) = std::sync::mpsc::channel();
        let s2 = s.clone();
        let finisher = s.spawn(move || {
            let _ = rx.recv();
            // Stopping now: a fiber of the scheduler may still submit.
            let r = s2.submit(|| 5, Some(3));
            let _ = htx.send(r.map_err(|e| format!("{e:?}")));
        });
        crate::common::wait_until("the finisher parks", || {
            s.metrics().workers().iter().map(|w| w.parks()).sum::<u64>() > 0
        });
        go_stop.send(()).unwrap();
        // Wait until stop refuses outside work.
        crate::common::wait_until("stop began", || s.submit(|| 0, None).is_err());
        tx.send(()).unwrap();
        match hrx.recv_timeout(LIMIT).expect("the finisher submitted") {
            Ok(pinned) => {
                eprintln!("the pinned submit during stop was admitted");
                assert!(
                    pinned.wait_timeout(Duration::from_secs(15)),
                    "the task pinned to the missing worker never ended"
                );
                assert!(pinned.join().unwrap_err().is_cancelled());
            }
            Err(e) => eprintln!("refused: {e}"),
        }
        assert!(finisher.wait_timeout(LIMIT));
        assert!(
            stopped.recv_timeout(Duration::from_secs(15)).is_ok(),
            "stop did not return"
        );
    });
}

/// Calls `s.stop()` on a thread of its own.
fn stop_in_background(s: &Arc<Scheduler>) -> Stopping {
    let (tx, rx) = std::sync::mpsc::channel();
    let s = s.clone();
    let thread = std::thread::spawn(move || {
        s.stop();
        let _ = tx.send(());
    });
    Stopping { rx, thread }
}

/// A `stop` running on its own thread.
struct Stopping {
    rx: std::sync::mpsc::Receiver<()>,
    thread: std::thread::JoinHandle<()>,
}

impl Stopping {
    /// Whether `stop` returned within `limit`; if it did, its thread has exited too, so that
    /// a thread cap counted next does not count a thread about to go.
    fn returned_within(self, limit: Duration) -> bool {
        let returned = self.rx.recv_timeout(limit).is_ok();
        if returned {
            self.thread.join().expect("the stopping thread");
        }
        returned
    }
}

/// The blocking pool cannot grow (RLIMIT_NPROC): many concurrent `unblock` calls still
/// complete, queued behind the threads it has, or run inline when it has none (`empty`).
fn unblock_under_a_thread_cap(empty: bool) {
    let s = Arc::new(Scheduler::builder().threads(2).build().expect("build"));
    s.start();
    // One pool thread exists before the cap (none if `empty`: the calls then run inline).
    if !empty {
        assert_eq!(s.block_on(|| fibra::unblock(|| 1)), 1);
    }
    // The two tests run at once: a uid each.
    cap_threads(if empty { EMPTY_POOL_UID } else { POOL_UID }, 0);
    assert!(!can_spawn_thread(), "the cap does not hold");
    let done = Arc::new(AtomicUsize::new(0));
    let hs: Vec<_> = (0..32)
        .map(|i| {
            let done = done.clone();
            s.spawn(move || {
                let v = fibra::unblock(move || {
                    std::thread::sleep(Duration::from_millis(5));
                    i
                });
                done.fetch_add(1, Ordering::SeqCst);
                v
            })
        })
        .collect();
    for (i, h) in hs.into_iter().enumerate() {
        assert!(h.wait_timeout(LIMIT), "unblock call {i} never completed");
        assert_eq!(h.join().unwrap(), i);
    }
    eprintln!("metrics: {} pool threads", s.metrics().blocking_threads());
}

/// [`unblock_under_a_thread_cap`] with one pool thread made before the cap.
#[test]
fn unblock_completes_when_the_pool_cannot_grow() {
    child_ok(|| unblock_under_a_thread_cap(false));
}

/// [`unblock_under_a_thread_cap`] with no pool thread: the calls run inline.
#[test]
fn unblock_completes_when_the_pool_has_no_thread_and_cannot_start_one() {
    let run = in_child(|| unblock_under_a_thread_cap(true));
    eprintln!("{}", run.stderr);
    run.assert_ok("unblock under a thread cap, with no pool thread");
}

// ============================================================ 4. timers

/// Many pending sleeps with `Duration::MAX`, zero and past deadlines, all cancelled: the
/// timers go away (metrics) and the scheduler stays usable.
#[test]
fn many_pending_timers_cancelled_come_back() {
    crate::common::with_deadline(|| {
        let s = Arc::new(
            Scheduler::builder()
                .threads(2)
                .stack_size(fibra::MIN_STACK_SIZE)
                .build()
                .unwrap(),
        );
        s.start();
        const N: usize = 20_000;
        let past = Instant::now();
        let mut hs = Vec::with_capacity(N);
        for i in 0..N {
            hs.push(s.spawn(move || match i % 4 {
                0 => fibra::sleep(Duration::MAX),
                1 => {
                    fibra::sleep(Duration::ZERO);
                    fibra::sleep(Duration::MAX)
                }
                2 => {
                    fibra::sleep_until(past);
                    let far = Instant::now() + Duration::from_secs(3600 * 24 * 365 * 100);
                    let _ = fibra::park_timeout(far, |_| {});
                }
                _ => fibra::sleep_until(Instant::now() + Duration::from_secs(3600 * 24 * 365 * 50)),
            }));
        }
        crate::common::wait_until("every fiber parked", || s.metrics().timers() == N);
        eprintln!("{:?}", s.metrics().timers());
        for h in &hs {
            h.cancel();
        }
        for h in hs {
            assert!(h.wait_timeout(LIMIT));
            assert!(h.join().unwrap_err().is_cancelled());
        }
        crate::common::wait_until("timers gone", || s.metrics().timers() == 0);
        assert_eq!(s.metrics().live_tasks(), 0);
        assert_eq!(s.block_on(|| 1), 1);
        s.stop();
    });
}

// ====================================================== 5a. hooked calls, bad pointers

/// One bad-pointer call, in a fiber or on a plain thread (`case` ends in `_thread`): the
/// call returns `-1` and `EFAULT`, `EINVAL` or `EMSGSIZE` instead of crashing.
fn bad_pointer_call(case: &str) {
    let s = Arc::new(Scheduler::builder().threads(1).build().unwrap());
    s.start();
    let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
    let (fa, fb) = (a.as_raw_fd(), b.as_raw_fd());
    let b = Arc::new(b);
    let b2 = b.clone();
    let bad = crate::common::unmapped_page() as usize;
    let run = move |case: &str| -> (isize, i32) {
        let badp = bad as *mut libc::c_void;
        // SAFETY: each call gets a pointer to no mapping, which the kernel refuses.
        let r: isize = unsafe {
            match case {
                "poll_fiber" | "poll_thread" => libc::poll(badp.cast(), 1, 100) as isize,
                "poll_misaligned" => {
                    libc::poll(std::ptr::without_provenance_mut(1), 1, 100) as isize
                }
                "ppoll_timeout" => {
                    let mut p = libc::pollfd {
                        fd: fa,
                        events: libc::POLLIN,
                        revents: 0,
                    };
                    libc::ppoll(&mut p, 1, badp.cast(), std::ptr::null()) as isize
                }
                "select_set" => libc::select(
                    fa.max(fb) + 1,
                    badp.cast(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                ) as isize,
                "select_timeout" => {
                    let mut set: libc::fd_set = std::mem::zeroed();
                    libc::FD_SET(fa, &mut set);
                    libc::select(
                        fa + 1,
                        &mut set,
                        std::ptr::null_mut(),
                        std::ptr::null_mut(),
                        badp.cast(),
                    ) as isize
                }
                "nanosleep" => libc::nanosleep(badp.cast(), std::ptr::null_mut()) as isize,
                "clock_nanosleep" => {
                    // Returns the error number itself.
                    let r = libc::clock_nanosleep(
                        libc::CLOCK_MONOTONIC,
                        0,
                        badp.cast(),
                        std::ptr::null_mut(),
                    );
                    if r == 0 {
                        0
                    } else {
                        *libc::__errno_location() = r;
                        -1
                    }
                }
                "writev_iov" | "writev_iov_thread" => libc::writev(fb, badp.cast(), 1),
                "writev_count" | "writev_count_thread" => {
                    // One real iovec, a count past IOV_MAX: the kernel says EINVAL without
                    // reading the array.
                    let byte = [0u8; 1];
                    let iov = [libc::iovec {
                        iov_base: byte.as_ptr() as *mut _,
                        iov_len: 1,
                    }];
                    libc::writev(fb, iov.as_ptr(), 1 << 30)
                }
                "sendmsg" | "sendmsg_thread" => libc::sendmsg(fb, badp.cast(), 0),
                "sendmsg_iovlen" | "sendmsg_iovlen_thread" => {
                    // A valid header and one real iovec, an iovec count past UIO_MAXIOV: the
                    // kernel says EMSGSIZE without reading the array.
                    let byte = [0u8; 1];
                    let iov = [libc::iovec {
                        iov_base: byte.as_ptr() as *mut _,
                        iov_len: 1,
                    }];
                    let mut m: libc::msghdr = std::mem::zeroed();
                    m.msg_iov = iov.as_ptr() as *mut _;
                    m.msg_iovlen = 1 << 30;
                    libc::sendmsg(fb, &m, 0)
                }
                "recvmsg_waitall" | "recvmsg_waitall_thread" => {
                    libc::recvmsg(fa, badp.cast(), libc::MSG_WAITALL | libc::MSG_DONTWAIT)
                }
                "readv_iov" => libc::readv(fa, badp.cast(), 1),
                "read_buf" => {
                    (&*b2).write_all(b"x").unwrap();
                    libc::read(fa, badp, 1)
                }
                "write_buf" => libc::write(fb, badp, 1),
                "recv_buf" => {
                    (&*b2).write_all(b"x").unwrap();
                    libc::recv(fa, badp, 1, 0)
                }
                "accept_addr" => {
                    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
                    let _c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
                    let r = libc::accept(l.as_raw_fd(), badp.cast(), bad as *mut libc::socklen_t);
                    std::mem::forget(l);
                    r as isize
                }
                "connect_addr" => {
                    let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
                    libc::connect(fd, badp.cast(), 16) as isize
                }
                "pipe" => libc::pipe(badp.cast()) as isize,
                "socketpair" => {
                    libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM, 0, badp.cast()) as isize
                }
                other => panic!("unknown case {other}"),
            }
        };
        (r, errno())
    };
    let on_thread = case.ends_with("_thread");
    let c = case.to_string();
    let (r, e) = if on_thread {
        run(&c)
    } else {
        s.block_on(move || run(&c))
    };
    eprintln!("{case}: returned {r}, errno {e}");
    assert_eq!(r, -1, "{case}");
    assert!(
        matches!(e, libc::EFAULT | libc::EINVAL | libc::EMSGSIZE),
        "{case}: errno {e}"
    );
    drop((a, b));
}

/// [`bad_pointer_call`] in a child process, which must end well.
fn bad_pointer_case(case: &str) {
    in_child(|| bad_pointer_call(case)).assert_ok(&format!(
        "case {case}: the child failed; the C library returns an error here"
    ));
}

// Not listed: a bad `ppoll` timeout or `select` timeout pointer. glibc's own wrappers read
// them in user space (64-bit time conversion) and crash without the hook too (the cases
// "ppoll_timeout" and "select_timeout" above show it), so the hook changes nothing there.
macro_rules! bad_pointer_tests {
    ($($name:ident => $case:literal,)*) => {$(
        #[test]
        fn $name() {
            bad_pointer_case($case);
        }
    )*};
}

bad_pointer_tests! {
    bad_pointer_poll_in_a_fiber => "poll_fiber",
    bad_pointer_poll_on_a_thread => "poll_thread",
    bad_pointer_poll_misaligned_in_a_fiber => "poll_misaligned",
    bad_pointer_select_set_in_a_fiber => "select_set",
    bad_pointer_nanosleep_in_a_fiber => "nanosleep",
    bad_pointer_clock_nanosleep_in_a_fiber => "clock_nanosleep",
    bad_pointer_writev_iov_in_a_fiber => "writev_iov",
    bad_pointer_writev_iov_on_a_thread => "writev_iov_thread",
    bad_count_writev_in_a_fiber => "writev_count",
    bad_count_writev_on_a_thread => "writev_count_thread",
    bad_pointer_sendmsg_in_a_fiber => "sendmsg",
    bad_pointer_sendmsg_on_a_thread => "sendmsg_thread",
    bad_count_sendmsg_in_a_fiber => "sendmsg_iovlen",
    bad_count_sendmsg_on_a_thread => "sendmsg_iovlen_thread",
    bad_pointer_recvmsg_waitall_in_a_fiber => "recvmsg_waitall",
    bad_pointer_recvmsg_waitall_on_a_thread => "recvmsg_waitall_thread",
    bad_pointer_readv_in_a_fiber => "readv_iov",
    bad_pointer_read_buf_in_a_fiber => "read_buf",
    bad_pointer_write_buf_in_a_fiber => "write_buf",
    bad_pointer_recv_buf_in_a_fiber => "recv_buf",
    bad_pointer_accept_addr_in_a_fiber => "accept_addr",
    bad_pointer_connect_addr_in_a_fiber => "connect_addr",
    bad_pointer_pipe_in_a_fiber => "pipe",
    bad_pointer_socketpair_in_a_fiber => "socketpair",
}

/// How many descriptors can still be opened (dups them all, then closes them).
fn free_fds() -> usize {
    crate::common::fill_descriptor_table(0).len()
}

/// Each descriptor-making call, tried with 0..=3 descriptors free: a failure must not keep
/// a descriptor (the count of free ones is the same before and after, once the call's
/// successful result is dropped; the reactor's own two count once, at its creation).
#[test]
fn no_descriptor_leaks_on_emfile_paths() {
    child_ok(|| {
        set_nofile(256);
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = std_listener.local_addr().unwrap();
        let dir = std::env::temp_dir().join(format!("fibra-exh-leak-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let s = Arc::new(Scheduler::builder().threads(1).build().expect("build"));
        s.start();
        let leaks = s.block_on(move || {
            type Op = Box<dyn Fn(usize) -> std::io::Result<()>>;
            let d = dir.clone();
            let ops: Vec<(&str, Op)> = vec![
                (
                    "tcp bind",
                    Box::new(|_| fibra::net::TcpListener::bind("127.0.0.1:0").map(drop)),
                ),
                (
                    "tcp connect",
                    Box::new(move |_| fibra::net::TcpStream::connect(addr).map(drop)),
                ),
                (
                    "udp bind",
                    Box::new(|_| fibra::net::UdpSocket::bind("127.0.0.1:0").map(drop)),
                ),
                (
                    "unix pair",
                    Box::new(|_| fibra::net::unix::UnixStream::pair().map(drop)),
                ),
                (
                    "unix bind",
                    Box::new(move |i| {
                        fibra::net::unix::UnixListener::bind(d.join(format!("l{i}"))).map(drop)
                    }),
                ),
                (
                    "unix datagram pair",
                    Box::new(|_| fibra::net::unix::UnixDatagram::pair().map(drop)),
                ),
                (
                    "fs open",
                    Box::new(|_| fibra::fs::File::open("/proc/self/status").map(drop)),
                ),
                (
                    "fs read",
                    Box::new(|_| fibra::fs::read("/proc/self/status").map(drop)),
                ),
            ];
            let mut leaks = Vec::new();
            let mut i = 0;
            for (name, op) in &ops {
                for free in 0..=3usize {
                    let mut held = crate::common::fill_descriptor_table(0);
                    for _ in 0..free {
                        held.pop();
                    }
                    let mut results = Vec::new();
                    for _ in 0..4 {
                        i += 1;
                        results.push(op(i).map_err(|e| e.raw_os_error()));
                    }
                    let left = free_fds();
                    drop(held);
                    // The reactor's two descriptors may appear at its first registration.
                    if left + 2 < free || (left < free && !results.iter().all(|r| r.is_ok())) {
                        leaks.push(format!(
                            "{name}: {free} free before, {left} after: {results:?}"
                        ));
                    }
                }
            }
            leaks
        });
        eprintln!("{leaks:#?}");
        assert!(
            leaks.is_empty(),
            "descriptors kept by failed calls: {leaks:#?}"
        );
        drop(std_listener);
    });
}

/// The hooked `poll` in a fiber, when the reactor cannot take the fd (here: no descriptor
/// for the reactor's epoll instance at its first registration; also any `epoll_ctl`
/// failure such as ENOMEM or ENOSPC from `max_user_watches`): the fd is left out of the
/// wait, and with nothing left to watch the fiber sleeps until the timeout — for ever with
/// `-1` — though the fd becomes readable. `read` in the same place blocks the thread in
/// poll(2) instead and returns with the data.
#[cfg(feature = "hook")]
#[test]
fn hooked_poll_wakes_when_the_reactor_cannot_take_the_fd() {
    child_ok(|| {
        set_nofile(256);
        let s = Arc::new(Scheduler::builder().threads(1).build().unwrap());
        s.start();
        let (r, mut w) = std::os::unix::net::UnixStream::pair().unwrap();
        let rfd = r.as_raw_fd();
        let held = crate::common::fill_descriptor_table(0);
        eprintln!(
            "holding {} fds; the reactor has not been created",
            held.len()
        );
        let h = s.spawn(move || {
            let t0 = Instant::now();
            let mut p = libc::pollfd {
                fd: rfd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd. A 10 s timeout, so a lost wake-up ends the test.
            let n = unsafe { libc::poll(&mut p, 1, 10_000) };
            (n, p.revents, t0.elapsed())
        });
        std::thread::sleep(Duration::from_millis(200));
        w.write_all(b"x").unwrap();
        assert!(h.wait_timeout(LIMIT));
        let (n, revents, took) = h.join().unwrap();
        eprintln!(
            "poll returned {n} (revents {revents:#x}) after {took:?}; data was written at 200 ms"
        );
        drop(held);
        assert_eq!(n, 1, "poll missed the data");
        assert!(
            took < Duration::from_secs(5),
            "poll woke only at its timeout: {took:?}"
        );
        drop(r);
    });
}

// ============================================================ 2. stacks

/// The address space runs out while fibers keep spawning (RLIMIT_AS, so in a child): the
/// tasks that get no stack fail on their handles with `is_no_stack`, the worker lives, and
/// once the parked fibers end and their stacks come back, spawning works again.
#[test]
fn stacks_run_out_then_come_back() {
    child_ok(|| {
        let s = Arc::new(
            Scheduler::builder()
                .threads(2)
                .stack_size(8 << 20)
                .stack_cache(0)
                .build()
                .unwrap(),
        );
        s.start();
        assert_eq!(s.block_on(|| 1), 1);
        let used = std::fs::read_to_string("/proc/self/statm")
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap()
            .parse::<u64>()
            .unwrap()
            * 4096;
        let lim = libc::rlimit {
            rlim_cur: used + (512 << 20),
            rlim_max: libc::RLIM_INFINITY,
        };
        // SAFETY: a valid rlimit.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_AS, &lim) }, 0);
        let (release_tx, release_rx) = fibra::sync::mpsc::channel::<()>();
        let release_rx = Arc::new(release_rx);
        let mut parked = Vec::new();
        let mut no_stack = 0;
        for i in 0..400 {
            let rx = release_rx.clone();
            let h = s.spawn(move || {
                let _ = rx.recv();
                i
            });
            // Let it start (or fail) before the next.
            if h.wait_timeout(Duration::from_millis(20)) {
                match h.join() {
                    Err(e) if e.is_no_stack() => {
                        no_stack += 1;
                        if no_stack >= 5 {
                            break;
                        }
                    }
                    other => panic!("task {i}: {other:?}"),
                }
            } else {
                parked.push(h);
            }
        }
        eprintln!(
            "{} fibers parked, {no_stack} refused with no stack",
            parked.len()
        );
        assert!(no_stack >= 5, "the cap was never reached");
        for _ in 0..parked.len() {
            release_tx.send(()).unwrap();
        }
        for h in parked {
            assert!(h.wait_timeout(LIMIT));
            h.join().unwrap();
        }
        // Stacks came back: new fibers start.
        let again: Vec<_> = (0..20).map(|i| s.spawn(move || i)).collect();
        for (i, h) in again.into_iter().enumerate() {
            assert!(h.wait_timeout(LIMIT));
            assert_eq!(h.join().expect("a stack after the others ended"), i);
        }
        s.stop();
    });
}

/// Stack sizes that make no sense are refused with the closure handed back, at the builder
/// and per task.
#[test]
fn stack_size_extremes_are_refused() {
    for bad in [0usize, 1, usize::MAX, usize::MAX - 4095, (1 << 30) + 1] {
        let b = Scheduler::builder().threads(1).stack_size(bad).build();
        assert!(b.is_err(), "builder accepted {bad}");
    }
    let s = Scheduler::builder().threads(1).build().unwrap();
    s.start();
    for bad in [0usize, 1, usize::MAX, usize::MAX - 4095] {
        match s.task().stack_size(bad).submit(|| 5, None) {
            Err(e) => assert_eq!(e.into_inner()(), 5),
            Ok(_) => panic!("task accepted {bad}"),
        }
    }
    // Not page aligned: rounded up, and runs.
    let h = s
        .task()
        .stack_size(fibra::MIN_STACK_SIZE + 1)
        .submit(|| 6, None)
        .unwrap();
    assert_eq!(crate::common::finish(h), 6);
    s.stop();
}

// ============================================================ 1b. hooked creators

/// With the hook feature, the hooked fd creators and waits in a fiber with the table full:
/// -1/EMFILE, and a later accept takes the connection pending meanwhile.
#[cfg(feature = "hook")]
#[test]
fn hooked_creators_under_emfile_fail_and_a_later_accept_recovers() {
    child_ok(|| {
        set_nofile(256);
        let s = Arc::new(Scheduler::builder().threads(1).build().unwrap());
        s.start();
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let l = Arc::new(l);
        // A first accept waits, so the listener is registered while descriptors are there.
        let l2 = l.clone();
        let warm = s.spawn(move || l2.accept().map(drop));
        std::net::TcpStream::connect(addr).unwrap();
        crate::common::finish(warm).unwrap();
        let client = std::net::TcpStream::connect(addr).unwrap();
        let held = crate::common::fill_descriptor_table(0);
        let l3 = l.clone();
        let errs = s.block_on(move || {
            let mut fds = [0; 2];
            // SAFETY: plain calls with valid arguments.
            unsafe {
                vec![
                    (
                        "socket",
                        libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0),
                        errno(),
                    ),
                    ("pipe", libc::pipe(fds.as_mut_ptr()), errno()),
                    (
                        "pipe2",
                        libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC),
                        errno(),
                    ),
                    ("eventfd", libc::eventfd(0, 0), errno()),
                    ("epoll_create1", libc::epoll_create1(0), errno()),
                    (
                        "socketpair",
                        libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM, 0, fds.as_mut_ptr()),
                        errno(),
                    ),
                    (
                        "accept (pending connection)",
                        l3.accept().map(|_| 0).unwrap_or(-1),
                        std::io::Error::last_os_error().raw_os_error().unwrap_or(0),
                    ),
                ]
            }
        });
        let bad: Vec<_> = errs
            .iter()
            .filter(|(_, r, e)| !(*r == -1 && *e == libc::EMFILE))
            .collect();
        eprintln!("{errs:?}");
        drop(held);
        let l4 = l.clone();
        let got = s.spawn(move || l4.accept().map(|(_, a)| a));
        assert!(
            got.wait_timeout(LIMIT),
            "the pending connection was never accepted"
        );
        let got = got.join().unwrap();
        eprintln!("after freeing: {got:?}");
        assert!(got.is_ok());
        assert!(bad.is_empty(), "{bad:?}");
        drop(client);
    });
}
