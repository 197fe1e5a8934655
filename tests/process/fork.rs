//! What fibra promises around `fork` (see `src/fork.rs` and the README's "Known
//! limitations"): a child of a busy, multithreaded parent makes a fresh scheduler and uses
//! spawn, sleep, channels, `fibra::net`, `unblock` and `fibra::fs`; the parent goes on
//! working however often and from wherever it forks. Every fork happens in a child process
//! of the test (`in_child`), and every forked grandchild is bounded: one that does not end
//! in time has its threads' backtraces printed (gdb) before it is killed, and counts as
//! "hung".

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::common::{child_ok, child_runs, describe, finish, fork_and, started, wait_child};
use fibra::Scheduler;

/// Generous bound for what correct code does in well under a second.
const BOUND: Duration = Duration::from_secs(20);
/// How long a forked grandchild may take before it counts as hung.
const FORK_LIMIT: Duration = Duration::from_secs(12);

/// Everything a fresh scheduler offers, in `s`: a connection over `fibra::net`, fibers that
/// sleep, a channel, `unblock` and `fibra::fs`.
fn uses_everything(s: &Scheduler, fibers: u64) {
    let v = s.block_on(move || {
        let l = fibra::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let c = fibra::spawn(move || {
            let mut c = fibra::net::TcpStream::connect(addr).unwrap();
            c.write_all(b"hi").unwrap();
        });
        let (mut accepted, _) = l.accept().unwrap();
        let mut buf = [0u8; 2];
        accepted.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"hi");
        c.join().unwrap();
        let hs: Vec<_> = (0..fibers)
            .map(|i| {
                fibra::spawn(move || {
                    fibra::sleep(Duration::from_micros(200));
                    i
                })
            })
            .collect();
        let (tx, rx) = fibra::sync::mpsc::channel();
        fibra::spawn(move || tx.send(1u64).unwrap());
        let sum: u64 = hs.into_iter().map(|h| h.join().unwrap()).sum();
        let path = std::env::temp_dir().join(format!("fibra-fork-test-{}", std::process::id()));
        fibra::fs::write(&path, b"abc").unwrap();
        let back = fibra::fs::read(&path).unwrap();
        let _ = fibra::fs::remove_file(&path);
        assert_eq!(back, b"abc");
        sum + rx.recv().unwrap() + fibra::unblock(|| 1u64)
    });
    assert_eq!(v, fibers * (fibers - 1) / 2 + 2);
}

/// A fresh scheduler in a forked child, used for everything, then stopped.
fn fresh_scheduler_uses_everything() {
    let s = started(2);
    uses_everything(&s, 100);
    s.stop();
}

/// A parent scheduler whose fibers keep every process-wide structure busy (spawn and join,
/// sleeps, `unblock`, sockets), until the returned flag is set.
fn busy_parent(s: &Arc<Scheduler>) -> (Arc<AtomicBool>, Vec<fibra::JoinHandle<()>>) {
    let stop = Arc::new(AtomicBool::new(false));
    let hs = (0..4)
        .map(|k| {
            let stop = stop.clone();
            s.submit(
                move || {
                    while !stop.load(Ordering::Relaxed) {
                        match k {
                            0 => {
                                let hs: Vec<_> = (0..32).map(|i| fibra::spawn(move || i)).collect();
                                for h in hs {
                                    h.join().unwrap();
                                }
                            }
                            1 => {
                                fibra::unblock(|| 1);
                            }
                            2 => {
                                let l = fibra::net::TcpListener::bind("127.0.0.1:0").unwrap();
                                let a = l.local_addr().unwrap();
                                let c = fibra::spawn(move || {
                                    fibra::net::TcpStream::connect(a).map(drop)
                                });
                                let _ = l.accept().unwrap();
                                c.join().unwrap().unwrap();
                            }
                            _ => fibra::sleep(Duration::from_micros(50)),
                        }
                    }
                },
                None,
            )
            .unwrap()
        })
        .collect();
    (stop, hs)
}

// ============================================================ 1. fork inside a fiber

/// A fiber of the parent's scheduler forks. In the child (the copy of that fiber's worker
/// thread, the only thread there) `body` runs; the parent's fiber waits for the child on the
/// blocking pool. Returns how the child ended.
fn fork_in_a_fiber(parent: &Scheduler, body: fn()) -> String {
    let h = parent
        .submit(
            move || {
                // SAFETY: the child runs `body` and exits.
                let pid = unsafe { libc::fork() };
                assert!(pid >= 0, "fork");
                if pid == 0 {
                    child_runs(body);
                }
                fibra::unblock(move || describe(wait_child(pid, FORK_LIMIT)))
            },
            None,
        )
        .unwrap();
    finish(h)
}

/// Runs `work` while a parent scheduler's fibers keep every structure busy
/// ([`busy_parent`]); then ends that load (each load fiber finishes) and stops the parent.
fn beside_a_busy_parent<T>(work: impl FnOnce(&Arc<Scheduler>) -> T) -> T {
    let parent = Arc::new(started(2));
    let (stop, load) = busy_parent(&parent);
    let r = work(&parent);
    stop.store(true, Ordering::SeqCst);
    for h in load {
        finish(h);
    }
    parent.stop();
    r
}

/// Ten forks, one at a time, each by a fiber of a busy parent ([`fork_in_a_fiber`]), the
/// child running `body`: how each child ended.
fn ten_forks_in_fibers_of_a_busy_parent(body: fn()) -> Vec<String> {
    let results = beside_a_busy_parent(|parent| {
        thread::sleep(Duration::from_millis(50));
        (0..10)
            .map(|_| fork_in_a_fiber(parent, body))
            .collect::<Vec<_>>()
    });
    eprintln!("forks: {results:?}");
    results
}

/// A fiber forks (as a library that forks and execs a helper would, or one that runs a
/// sub-server in the child); the child makes a fresh scheduler of its own and runs a fiber
/// in it with `block_on`. The README says "a scheduler made there gets I/O readiness and
/// pool threads of its own"; only the inherited one is out of use.
#[test]
fn fork_in_a_fiber_child_can_block_on_a_fresh_scheduler() {
    child_ok(|| {
        let results = ten_forks_in_fibers_of_a_busy_parent(|| {
            let s = started(1);
            uses_everything(&s, 50);
            std::mem::forget(s);
        });
        assert!(results.iter().all(|r| r == "ok"), "{results:?}");
    });
}

/// As above; the child calls `fibra::unblock`, documented to run the function inline
/// anywhere but in a scheduled fiber, and `fibra::sleep`. The fiber's scheduler has no
/// worker in the child: the calls must not wait for ever without a word (compare
/// `nesting::fork_child_touching_the_inherited_scheduler_does_not_hang_silently`, which
/// asks that of the inherited scheduler's own API).
#[test]
fn fork_in_a_fiber_child_unblock_and_sleep_do_not_hang() {
    child_ok(|| {
        let results = ten_forks_in_fibers_of_a_busy_parent(|| {
            assert_eq!(fibra::unblock(|| 5), 5);
            fibra::sleep(Duration::from_millis(2));
        });
        assert!(
            results.iter().all(|r| !r.starts_with("hung")),
            "{results:?}"
        );
    });
}

/// A fiber forks and, in the child, waits (a sleep, an `unblock`) and then returns from its
/// closure. A sibling fiber of the same worker is ready to run at the fork and writes to a
/// pipe whenever it runs in another process than the parent. The child must never run that
/// copy (it would repeat the parent's effects), its waits must still work, and it must end
/// with status 0 when the forking fiber returns; before, the child's copy of the worker
/// loop ran the copied sibling for ever.
#[test]
fn a_fiber_that_forks_ends_the_child_and_runs_no_copied_fiber() {
    child_ok(|| {
        let parent = started(1);
        let mut fds = [0; 2];
        // SAFETY: a fresh pipe into a live array.
        assert_eq!(
            unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK) },
            0
        );
        let (r, w) = (fds[0], fds[1]);
        // SAFETY: getpid has no preconditions.
        let parent_pid = unsafe { libc::getpid() };
        let stop = Arc::new(AtomicBool::new(false));
        let st = stop.clone();
        let sibling = parent
            .submit(
                move || {
                    while !st.load(Ordering::Relaxed) {
                        // SAFETY: getpid has no preconditions; one byte from a static buffer.
                        if unsafe { libc::getpid() } != parent_pid {
                            unsafe { libc::write(w, b"D".as_ptr().cast(), 1) };
                        }
                        fibra::Fiber::yield_now();
                    }
                },
                Some(0),
            )
            .unwrap();
        let forker = parent
            .submit(
                || {
                    // SAFETY: the child runs fibra calls of its own and returns.
                    let pid = unsafe { libc::fork() };
                    assert!(pid >= 0, "fork");
                    if pid == 0 {
                        fibra::sleep(Duration::from_millis(20));
                        assert_eq!(fibra::unblock(|| 3), 3);
                        return None;
                    }
                    Some(fibra::unblock(move || {
                        describe(wait_child(pid, FORK_LIMIT))
                    }))
                },
                Some(0),
            )
            .unwrap();
        let how = finish(forker).expect("the parent's side");
        stop.store(true, Ordering::SeqCst);
        finish(sibling);
        parent.stop();
        let mut buf = [0u8; 16];
        // SAFETY: reading into a live buffer from our own non-blocking pipe.
        let n = unsafe { libc::read(r, buf.as_mut_ptr().cast(), buf.len()) };
        assert_eq!(how, "ok", "the child did not end when its fiber returned");
        assert!(
            n < 0,
            "the child ran a copy of the sibling fiber ({n} bytes)"
        );
    });
}

/// Control: a fiber forks and the child starts a plain thread that makes a fresh scheduler
/// and uses everything in it.
#[test]
fn fork_in_a_fiber_child_thread_uses_a_fresh_scheduler() {
    child_ok(|| {
        let results = ten_forks_in_fibers_of_a_busy_parent(|| {
            thread::spawn(fresh_scheduler_uses_everything)
                .join()
                .unwrap();
        });
        assert!(results.iter().all(|r| r == "ok"), "{results:?}");
    });
}

// ================================================ 2. the reactor created during a fork

static ARMED: AtomicBool = AtomicBool::new(false);
static GO: AtomicBool = AtomicBool::new(false);

/// Whether this process has an epoll instance (fibra's reactor) yet.
fn has_epoll() -> bool {
    std::fs::read_dir("/proc/self/fd").is_ok_and(|d| {
        d.flatten().any(|e| {
            std::fs::read_link(e.path()).is_ok_and(|t| t.to_string_lossy().contains("eventpoll"))
        })
    })
}

/// A `prepare` handler registered before fibra's, so it runs after it: when armed, it lets a
/// fiber open the process's first socket and waits until the reactor exists and a worker
/// polls it. It only stretches the window between fibra's `prepare` and the fork itself,
/// which every fork has (other handlers, the C library's own locks).
extern "C" fn late_prepare() {
    if !ARMED.swap(false, Ordering::SeqCst) {
        return;
    }
    GO.store(true, Ordering::SeqCst);
    let end = Instant::now() + Duration::from_secs(5);
    while !has_epoll() && Instant::now() < end {
        thread::sleep(Duration::from_millis(1));
    }
    thread::sleep(Duration::from_millis(100)); // the fiber parks, a worker polls
}

/// A fiber opens the process's first socket (creating the reactor) while the main thread
/// forks. fibra's `prepare` found no reactor, so its `child` handler leaves the one the child
/// inherits as it is: the parent's epoll instance and eventfd, shared between the two
/// processes, its poller role taken by a parent worker. The child's fresh scheduler must
/// still get its sockets' readiness, and the parent its own.
#[test]
fn fork_while_a_fiber_creates_the_reactor_keeps_readiness_in_both_processes() {
    child_ok(|| {
        // SAFETY: registers a plain function; before fibra registers its own handlers.
        unsafe { libc::pthread_atfork(Some(late_prepare), None, None) };
        let parent = started(2);
        assert_eq!(parent.block_on(|| 1), 1); // fibra's handlers are registered now
        assert!(!has_epoll());
        let addr = Arc::new(std::sync::Mutex::new(None));
        let a = addr.clone();
        let accepter = parent
            .submit(
                move || {
                    while !GO.load(Ordering::SeqCst) {
                        fibra::sleep(Duration::from_micros(100));
                    }
                    let l = fibra::net::TcpListener::bind("127.0.0.1:0").unwrap();
                    *a.lock().unwrap() = Some(l.local_addr().unwrap());
                    let mut n = 0;
                    while n < 5 {
                        let (mut c, _) = l.accept().unwrap();
                        c.write_all(b"p").unwrap();
                        n += 1;
                    }
                    n
                },
                None,
            )
            .unwrap();
        ARMED.store(true, Ordering::SeqCst);
        let how = fork_and(FORK_LIMIT, || {
            thread::spawn(|| {
                let s = started(1);
                for _ in 0..5 {
                    uses_everything(&s, 10);
                }
            })
            .join()
            .unwrap();
        });
        eprintln!("forked child: {how}");
        // The parent's own sockets, after the fork.
        let addr = addr.lock().unwrap().expect("the fiber opened its socket");
        let parent_ok = thread::spawn(move || {
            for _ in 0..5 {
                let mut c = std::net::TcpStream::connect(addr).unwrap();
                c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                let mut b = [0u8; 1];
                c.read_exact(&mut b).unwrap();
            }
        })
        .join()
        .is_ok();
        let accepted = accepter.wait_timeout(Duration::from_secs(5));
        eprintln!("parent: connections served {parent_ok}, accepter finished {accepted}");
        assert_eq!(how, "ok", "the child's fresh scheduler");
        assert!(parent_ok && accepted, "the parent's own socket");
        parent.stop();
    });
}

/// As above without any help: many times over, a fresh process (forked from this one,
/// which never opened a socket) has a fiber open its first socket while its main thread
/// forks at about the same moment; each grandchild uses a fresh scheduler. Reports the rate.
#[test]
fn fork_racing_the_first_socket_leaves_every_grandchild_a_working_scheduler() {
    child_ok(|| {
        let mut results = Vec::new();
        for round in 0..100u32 {
            let how = fork_and(Duration::from_secs(15), || {
                // A fresh process with one thread, and no reactor.
                let s = Arc::new(started(2));
                let about = Arc::new(AtomicBool::new(false));
                let ab = about.clone();
                let _h = s.submit(
                    move || {
                        ab.store(true, Ordering::SeqCst);
                        let l = fibra::net::TcpListener::bind("127.0.0.1:0").unwrap();
                        let _ = l.accept();
                    },
                    None,
                );
                while !about.load(Ordering::SeqCst) {
                    std::hint::spin_loop();
                }
                // A delay that varies with the pid, across the socket's creation.
                let spins = (std::process::id() % 64) * 300;
                for _ in 0..spins {
                    std::hint::spin_loop();
                }
                // SAFETY: the grandchild uses a fresh scheduler and exits.
                let pid = unsafe { libc::fork() };
                if pid == 0 {
                    child_runs(|| {
                        thread::spawn(|| {
                            let s = started(1);
                            uses_everything(&s, 10);
                        })
                        .join()
                        .unwrap();
                    });
                }
                let how = describe(wait_child(pid, Duration::from_secs(5)));
                std::mem::forget(s); // its parked fiber would hold up a drop
                assert_eq!(how, "ok");
            });
            results.push(how);
            if results.iter().filter(|r| *r != "ok").count() >= 3 {
                break;
            }
            if round % 20 == 19 {
                eprintln!("after {} rounds: {:?}", round + 1, tally(&results));
            }
        }
        let t = tally(&results);
        eprintln!("rounds: {t:?}");
        assert!(results.iter().all(|r| r == "ok"), "{t:?}");
    });
}

fn tally(results: &[String]) -> Vec<(String, usize)> {
    let mut t: Vec<(String, usize)> = Vec::new();
    for r in results {
        match t.iter_mut().find(|(k, _)| k == r) {
            Some((_, n)) => *n += 1,
            None => t.push((r.clone(), 1)),
        }
    }
    t
}

static SECOND_GO: AtomicBool = AtomicBool::new(false);
static FIRST_TID: AtomicI32 = AtomicI32::new(0);

extern "C" fn late_prepare_two() {
    if crate::common::gettid() != FIRST_TID.load(Ordering::SeqCst) {
        return; // the second fork
    }
    // The first fork: fibra's prepare found no reactor. A fiber creates it; then the second
    // thread forks, and its fibra prepare takes the reactor's locks and waits for the
    // others, which this fork holds.
    GO.store(true, Ordering::SeqCst);
    let end = Instant::now() + Duration::from_secs(5);
    while !has_epoll() && Instant::now() < end {
        thread::sleep(Duration::from_millis(1));
    }
    thread::sleep(Duration::from_millis(100));
    SECOND_GO.store(true, Ordering::SeqCst);
    thread::sleep(Duration::from_millis(100));
}

/// Two threads fork at once while a fiber creates the reactor between the first fork's
/// `prepare` and the second's (the C library runs `prepare` handlers of concurrent forks
/// concurrently). Both children's fresh schedulers must get their sockets' readiness.
#[test]
fn concurrent_forks_while_the_reactor_is_created_give_both_children_readiness() {
    child_ok(|| {
        // SAFETY: registers a plain function; before fibra registers its own handlers.
        unsafe { libc::pthread_atfork(Some(late_prepare_two), None, None) };
        let parent = started(2);
        assert_eq!(parent.block_on(|| 1), 1);
        let accepter = parent
            .submit(
                || {
                    while !GO.load(Ordering::SeqCst) {
                        fibra::sleep(Duration::from_micros(100));
                    }
                    let l = fibra::net::TcpListener::bind("127.0.0.1:0").unwrap();
                    let _ = l.accept();
                },
                None,
            )
            .unwrap();
        let body: fn() = || {
            thread::spawn(|| {
                let s = started(1);
                uses_everything(&s, 10);
            })
            .join()
            .unwrap();
        };
        let second = thread::spawn(move || {
            while !SECOND_GO.load(Ordering::SeqCst) {
                std::hint::spin_loop();
            }
            fork_and(FORK_LIMIT, body)
        });
        FIRST_TID.store(crate::common::gettid(), Ordering::SeqCst);
        let first = fork_and(FORK_LIMIT, body);
        let second = second.join().unwrap();
        eprintln!("first fork's child: {first}; second fork's child: {second}");
        accepter.cancel();
        parent.stop_timeout(Duration::from_secs(1));
        assert!(first == "ok" && second == "ok", "{first} / {second}");
    });
}

// ============================================================ 3. the parent under forks

/// Many fibers spawn processes at once with `std::process::Command`, half of them with a
/// `pre_exec` hook (std then forks instead of using `posix_spawn`, so fibra's handlers run
/// on the worker threads), while other fibers keep every structure busy; a plain thread
/// forks too. Every command must finish, and the parent's scheduler keep working.
#[test]
fn commands_spawned_from_many_fibers_under_load_all_finish() {
    child_ok(|| {
        use std::os::unix::process::CommandExt;
        let parent = Arc::new(started(2));
        let (stop, load) = busy_parent(&parent);
        let forker_stop = Arc::new(AtomicBool::new(false));
        let fs = forker_stop.clone();
        let forker = thread::spawn(move || {
            let mut n = 0;
            while !fs.load(Ordering::Relaxed) {
                let how = fork_and(FORK_LIMIT, fresh_scheduler_uses_everything);
                assert_eq!(how, "ok");
                n += 1;
            }
            n
        });
        let done = Arc::new(AtomicUsize::new(0));
        let spawners: Vec<_> = (0..8)
            .map(|k| {
                let done = done.clone();
                parent
                    .submit(
                        move || {
                            for i in 0..10 {
                                let mut cmd = std::process::Command::new("/bin/true");
                                cmd.stdin(std::process::Stdio::null())
                                    .stdout(std::process::Stdio::null())
                                    .stderr(std::process::Stdio::null());
                                if (k + i) % 2 == 0 {
                                    // SAFETY: the hook calls nothing.
                                    unsafe { cmd.pre_exec(|| Ok(())) };
                                }
                                let mut child = cmd.spawn().unwrap();
                                let st = fibra::unblock(move || child.wait()).unwrap();
                                assert!(st.success());
                                done.fetch_add(1, Ordering::SeqCst);
                            }
                        },
                        None,
                    )
                    .unwrap()
            })
            .collect();
        let end = Instant::now() + Duration::from_secs(40);
        let mut all = true;
        for h in spawners {
            let left = end.saturating_duration_since(Instant::now());
            all &= h.wait_timeout(left);
        }
        if !all {
            eprintln!(
                "commands finished: {}; parent threads:\n{}",
                done.load(Ordering::SeqCst),
                crate::common::backtrace(std::process::id() as i32)
            );
        }
        forker_stop.store(true, Ordering::SeqCst);
        stop.store(true, Ordering::SeqCst);
        let forks = forker.join().unwrap();
        for h in load {
            assert!(
                h.wait_timeout(BOUND),
                "a load fiber stopped making progress"
            );
        }
        crate::common::every_worker_runs(&parent);
        eprintln!(
            "commands: {}, plain forks: {forks}",
            done.load(Ordering::SeqCst)
        );
        assert!(all, "not every command finished");
        assert_eq!(done.load(Ordering::SeqCst), 80);
        parent.stop();
    });
}

fn fork_exit_at_once() -> String {
    // SAFETY: the child exits at once.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        // SAFETY: ends the child.
        unsafe { libc::_exit(0) };
    }
    describe(wait_child(pid, FORK_LIMIT))
}

/// Forks from everywhere at once for a while — fibers on both workers, a plain thread, an
/// `unblock` call, a readiness continuation — while fibers keep every structure busy and
/// another thread builds, fills and stops schedulers (stacks trimmed, slabs given back):
/// each child exits at once, as one that execs would. The parent must keep working: no
/// lock left held, no wake-up lost.
#[test]
fn the_parent_keeps_working_after_many_forks_from_everywhere() {
    child_ok(|| {
        let parent = Arc::new(started(2));
        let (stop, load) = busy_parent(&parent);
        let forks = Arc::new(AtomicUsize::new(0));
        let bad = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let record = |forks: &AtomicUsize, bad: &std::sync::Mutex<Vec<String>>, how: String| {
            forks.fetch_add(1, Ordering::Relaxed);
            if how != "ok" {
                bad.lock().unwrap().push(how);
            }
        };
        let end = Instant::now() + Duration::from_secs(4);
        let mut fibers = Vec::new();
        for _ in 0..2 {
            let (f, b) = (forks.clone(), bad.clone());
            fibers.push(
                parent
                    .submit(
                        move || {
                            while Instant::now() < end {
                                record(&f, &b, fork_exit_at_once());
                                fibra::Fiber::yield_now();
                            }
                        },
                        None,
                    )
                    .unwrap(),
            );
        }
        // From inside `unblock`.
        let (f, b) = (forks.clone(), bad.clone());
        fibers.push(
            parent
                .submit(
                    move || {
                        while Instant::now() < end {
                            let how = fibra::unblock(fork_exit_at_once);
                            record(&f, &b, how);
                        }
                    },
                    None,
                )
                .unwrap(),
        );
        // From readiness continuations: a chain of them over a socket pair.
        let (f, b) = (forks.clone(), bad.clone());
        let chain_done = Arc::new(AtomicUsize::new(0));
        let cd = chain_done.clone();
        fibers.push(
            parent
                .submit(
                    move || {
                        let l = fibra::net::TcpListener::bind("127.0.0.1:0").unwrap();
                        let a = l.local_addr().unwrap();
                        let writer = fibra::spawn(move || {
                            let mut c = fibra::net::TcpStream::connect(a).unwrap();
                            while Instant::now() < end {
                                c.write_all(b"x").unwrap();
                                fibra::sleep(Duration::from_millis(2));
                            }
                        });
                        let (s, _) = l.accept().unwrap();
                        fn step(
                            s: fibra::net::TcpStream,
                            f: Arc<AtomicUsize>,
                            b: Arc<std::sync::Mutex<Vec<String>>>,
                            cd: Arc<AtomicUsize>,
                        ) {
                            let mut buf = [0u8; 64];
                            loop {
                                match s.try_read(&mut buf) {
                                    Ok(0) => {
                                        cd.fetch_add(1, Ordering::SeqCst);
                                        return;
                                    }
                                    Ok(_) => {
                                        let how = fork_exit_at_once();
                                        f.fetch_add(1, Ordering::Relaxed);
                                        if how != "ok" {
                                            b.lock().unwrap().push(how);
                                        }
                                    }
                                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                                        let (f2, b2, cd2) = (f.clone(), b.clone(), cd.clone());
                                        if s.spawn_when_readable(move |s| step(s, f2, b2, cd2))
                                            .is_err()
                                        {
                                            cd.fetch_add(1, Ordering::SeqCst);
                                        }
                                        return;
                                    }
                                    Err(_) => {
                                        cd.fetch_add(1, Ordering::SeqCst);
                                        return;
                                    }
                                }
                            }
                        }
                        step(s, f, b, cd);
                        writer.join().unwrap();
                    },
                    None,
                )
                .unwrap(),
        );
        // From a plain thread, and schedulers built, filled and stopped meanwhile.
        let (f, b) = (forks.clone(), bad.clone());
        let plain = thread::spawn(move || {
            while Instant::now() < end {
                record(&f, &b, fork_exit_at_once());
            }
        });
        let churn = thread::spawn(move || {
            while Instant::now() < end {
                let own = Scheduler::builder()
                    .threads(2)
                    .stack_size(96 * 1024)
                    .build()
                    .unwrap();
                own.start();
                uses_everything(&own, 300);
                own.stop_timeout(Duration::from_millis(50));
            }
        });
        for h in fibers {
            assert!(
                h.wait_timeout(Duration::from_secs(40)),
                "a forking fiber is stuck"
            );
            h.join().unwrap();
        }
        plain.join().unwrap();
        churn.join().unwrap();
        stop.store(true, Ordering::SeqCst);
        for h in load {
            assert!(
                h.wait_timeout(BOUND),
                "a load fiber stopped making progress"
            );
        }
        crate::common::every_worker_runs(&parent);
        uses_everything(&parent, 100);
        let n = forks.load(Ordering::SeqCst);
        let bad = bad.lock().unwrap().clone();
        eprintln!(
            "forks: {n}, failed: {bad:?}, continuation chain ended: {}",
            chain_done.load(Ordering::SeqCst)
        );
        assert!(bad.is_empty(), "{bad:?}");
        assert!(n > 20, "too few forks: {n}");
        parent.stop();
    });
}

// ======================================================== 4. children that do more

/// A call on the blocking pool forks; the child (a copy of the pool thread) builds a
/// fresh scheduler and uses everything, then exits. Also a child that returns from the
/// call (the pool then finishes a call whose caller is in the parent) and just lets its
/// last thread end: it must end, not crash.
#[test]
fn fork_inside_unblock_child_uses_a_fresh_scheduler() {
    child_ok(|| {
        fibra::unblock::set_keep_alive(Duration::from_millis(200));
        let (results, returned) = beside_a_busy_parent(|parent| {
            let mut results = Vec::new();
            for _ in 0..5 {
                let h = parent
                    .submit(
                        || fibra::unblock(|| fork_and(FORK_LIMIT, fresh_scheduler_uses_everything)),
                        None,
                    )
                    .unwrap();
                results.push(finish(h));
            }
            // The child returns from the call. It must then end (the call's caller is a fiber of
            // the inherited scheduler, which never runs there), not linger as an idle pool thread
            // for the keep-alive, which is made longer than the wait for the child.
            fibra::unblock::set_keep_alive(FORK_LIMIT * 5);
            let h = parent
                .submit(
                    || {
                        fibra::unblock(|| {
                            // SAFETY: both processes go on; the child's only thread is this one.
                            let pid = unsafe { libc::fork() };
                            assert!(pid >= 0);
                            if pid == 0 {
                                return None;
                            }
                            Some(describe(wait_child(pid, FORK_LIMIT)))
                        })
                    },
                    None,
                )
                .unwrap();
            let returned = finish(h);
            if returned.is_none() {
                // The child, after its pool thread finished the call: this runs nowhere.
                // SAFETY: ends the process.
                unsafe { libc::_exit(9) };
            }
            (results, returned)
        });
        eprintln!("forks: {results:?}; child that returned from the call: {returned:?}");
        assert!(results.iter().all(|r| r == "ok"), "{results:?}");
        assert_eq!(returned.as_deref(), Some("ok"));
    });
}

static INHERITED_FD: AtomicI32 = AtomicI32::new(-1);

/// The parent's fiber waits to read a socket (its record has a waiter, a worker polls).
/// The main thread forks; the child takes the same descriptor into `fibra::net` in a fresh
/// scheduler and reads what the peer sends it; a second child closes it. The parent's
/// fiber then gets its own data.
#[test]
fn fork_child_uses_and_closes_an_inherited_socket() {
    child_ok(|| {
        let parent = started(2);
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let stream = Arc::new(
            parent
                .block_on(move || fibra::net::TcpStream::connect(addr))
                .unwrap(),
        );
        let (mut peer, _) = l.accept().unwrap();
        INHERITED_FD.store(stream.as_raw_fd(), Ordering::SeqCst);
        let s2 = stream.clone();
        let reader = parent
            .submit(
                move || {
                    let mut buf = [0u8; 1];
                    (&*s2).read_exact(&mut buf).unwrap();
                },
                None,
            )
            .unwrap();
        // The fiber parks on its read, a worker polls.
        thread::sleep(Duration::from_millis(200));
        // SAFETY: the child only runs its body and exits.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            child_runs(|| {
                thread::spawn(|| {
                    let s = started(1);
                    let got = s.block_on(|| {
                        let fd = INHERITED_FD.load(Ordering::SeqCst);
                        // SAFETY: the inherited descriptor, owned by this process's copy.
                        let c = unsafe { fibra::net::TcpStream::from_raw_fd(fd) };
                        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                        let mut buf = [0u8; 1];
                        (&c).read_exact(&mut buf).unwrap();
                        std::mem::forget(c);
                        buf[0]
                    });
                    assert_eq!(got, b'c');
                })
                .join()
                .unwrap();
            });
        }
        // The parent's reader gives up, so that only the child reads "c" (sent once the child's
        // fiber waits).
        reader.cancel();
        assert!(reader.wait_timeout(BOUND));
        thread::sleep(Duration::from_millis(300));
        peer.write_all(b"c").unwrap();
        let uses = describe(wait_child(pid, FORK_LIMIT));
        // A child that closes the inherited socket through fibra::net.
        let closes = fork_and(FORK_LIMIT, || {
            thread::spawn(|| {
                let s = started(1);
                s.block_on(|| {
                    let fd = INHERITED_FD.load(Ordering::SeqCst);
                    // SAFETY: as above.
                    let c = unsafe { fibra::net::TcpStream::from_raw_fd(fd) };
                    drop(c);
                });
                uses_everything(&s, 10);
            })
            .join()
            .unwrap();
        });
        // The parent reads the same socket again, in a fresh fiber.
        let s3 = stream.clone();
        let again = parent
            .submit(
                move || {
                    let mut buf = [0u8; 1];
                    (&*s3).read_exact(&mut buf).unwrap();
                    buf[0]
                },
                None,
            )
            .unwrap();
        thread::sleep(Duration::from_millis(100));
        peer.write_all(b"p").unwrap();
        let got = again
            .wait_timeout(Duration::from_secs(5))
            .then(|| again.join().unwrap());
        eprintln!("child reading: {uses}; child closing: {closes}; parent read {got:?}");
        parent.stop_timeout(Duration::from_secs(1));
        assert_eq!(uses, "ok");
        assert_eq!(closes, "ok");
        assert_eq!(got, Some(b'p'), "the parent's read after the children");
    });
}

/// A child forks again from its main thread while its own fresh scheduler is busy; the
/// grandchild uses a fresh scheduler too.
#[test]
fn fork_grandchild_uses_a_fresh_scheduler() {
    child_ok(|| {
        let how = beside_a_busy_parent(|_| {
            thread::sleep(Duration::from_millis(50));
            fork_and(Duration::from_secs(25), || {
                let s = Arc::new(started(2));
                let (stop, load) = busy_parent(&s);
                thread::sleep(Duration::from_millis(50));
                let how = fork_and(FORK_LIMIT, fresh_scheduler_uses_everything);
                stop.store(true, Ordering::SeqCst);
                for h in load {
                    assert!(h.wait_timeout(BOUND));
                }
                uses_everything(&s, 50);
                assert_eq!(how, "ok", "grandchild");
                std::mem::forget(s);
            })
        });
        eprintln!("child (and grandchild): {how}");
        assert_eq!(how, "ok");
    });
}

fn recurse(depth: u64) -> u64 {
    let frame = std::hint::black_box([depth as u8; 4096]);
    if std::hint::black_box(depth) == u64::MAX {
        return 0;
    }
    recurse(depth + 1).wrapping_add(u64::from(frame[(depth % 4096) as usize]))
}

/// Stacks the parent's scheduler used and gave back (their guard pages installed in the
/// parent) are reused by a fresh scheduler in a forked child: a fiber there that overflows
/// must still be caught by the guard (fibra reports it and the process dies of SIGSEGV or
/// abort), not run into a neighbour stack silently.
#[test]
fn fork_child_stack_overflow_still_hits_the_guard() {
    child_ok(|| {
        let mk = || {
            let s = Scheduler::builder()
                .threads(1)
                .stack_size(64 * 1024)
                .build()
                .unwrap();
            s.start();
            s
        };
        let parent = mk();
        crate::common::park_burst::<8>(&parent, 64, None, || {});
        parent.stop();
        drop(parent);
        // SAFETY: the child overflows a fiber, which ends it.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            child_runs(|| {
                let s = mk();
                let h = s.submit(|| recurse(0), None).unwrap();
                let _ = h.wait_timeout(Duration::from_secs(5));
                eprintln!("the overflowing fiber's child survived");
                // SAFETY: ends the child with a distinct status.
                unsafe { libc::_exit(7) };
            });
        }
        let how = describe(wait_child(pid, FORK_LIMIT));
        eprintln!("overflowing child: {how}");
        assert!(
            how == format!("signal {}", libc::SIGSEGV)
                || how == format!("signal {}", libc::SIGABRT),
            "{how}"
        );
    });
}

// ================================================================= 5. hook

/// `hook`: fibra's fork handlers registered before the hooks' own (the program used a
/// standalone fiber, or a socket, before building its first scheduler), so in a child
/// fibra's handler runs first, before the hooks know they are in a forked child. It
/// replaces the reactor's descriptors with `dup3` and `close`, which are hooked, and whose
/// hooks take locks that a parent thread may hold at the fork (the fd table's `VIEWS`,
/// taken by every hooked `dup`). A plain thread of the parent `dup`s a hooked socket in a
/// loop while the main thread forks; every child must end.
#[cfg(feature = "hook")]
#[test]
fn hook_fork_child_handler_does_not_take_the_hooks_locks() {
    child_ok(|| {
        // A standalone fiber first: fibra registers its fork handlers now.
        let mut f = fibra::Fiber::new(|| {});
        f.resume();
        // Then a scheduler (the hooks register theirs) and a socket waited on (the reactor).
        let s = started(1);
        s.block_on(|| {
            let (a, _b) = fibra::net::unix::UnixStream::pair().unwrap();
            a.set_read_timeout(Some(Duration::from_millis(5))).unwrap();
            let mut buf = [0u8; 1];
            assert!((&a).read(&mut buf).is_err());
        });
        let (x, _y) = std::os::unix::net::UnixStream::pair().unwrap();
        let fd = x.as_raw_fd();
        let stop = Arc::new(AtomicBool::new(false));
        let st = stop.clone();
        let duper = thread::spawn(move || {
            while !st.load(Ordering::Relaxed) {
                // SAFETY: duplicates and closes our own socket (both calls hooked).
                unsafe {
                    let d = libc::dup(fd);
                    libc::close(d);
                }
            }
        });
        let mut results = Vec::new();
        for _ in 0..300 {
            results.push(fork_and(Duration::from_secs(5), || {}));
            if results.last().is_some_and(|r| r != "ok") {
                break;
            }
        }
        stop.store(true, Ordering::SeqCst);
        duper.join().unwrap();
        let t = tally(&results);
        eprintln!("forks: {t:?}");
        assert!(results.iter().all(|r| r == "ok"), "{t:?}");
        drop(x);
        s.stop();
    });
}

/// `hook`: a fiber forks; the child (a copy of the fiber's worker) makes plain blocking
/// calls (std sleep, a std socket read), which must not park (the child has no worker) and
/// must block as on a plain thread; a thread of the child uses a fresh scheduler.
#[cfg(feature = "hook")]
#[test]
fn hook_fork_in_a_fiber_child_blocking_calls_block_as_on_a_plain_thread() {
    child_ok(|| {
        let how = beside_a_busy_parent(|parent| {
            fork_in_a_fiber(parent, || {
                let t = Instant::now();
                thread::sleep(Duration::from_millis(20));
                assert!(t.elapsed() >= Duration::from_millis(20));
                let (mut a, b) = std::os::unix::net::UnixStream::pair().unwrap();
                let w = thread::spawn(move || {
                    thread::sleep(Duration::from_millis(50));
                    (&b).write_all(b"z").unwrap();
                    b
                });
                let mut buf = [0u8; 1];
                a.read_exact(&mut buf).unwrap();
                assert_eq!(buf[0], b'z');
                w.join().unwrap();
                thread::spawn(fresh_scheduler_uses_everything)
                    .join()
                    .unwrap();
            })
        });
        eprintln!("forked child: {how}");
        assert_eq!(how, "ok");
    });
}
