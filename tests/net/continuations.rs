//! Readiness continuations (`TcpStream::spawn_when_readable`, `UnixStream`'s, `try_read`,
//! `try_write`) on 127.0.0.1: the task runs when data or a hang-up comes, at once when the
//! socket is readable already, never without a scheduler; a pending continuation holds no
//! stack but counts as live, so `stop` waits for it and `stop_timeout` drops it (a panicking
//! `Drop` included); a refusal hands back the socket and the closure; a panicking task ends
//! alone; many connections served as chains of continuations all get every answer, also
//! during a `stop` that waits for them; and an idle timeout is a shutdown of a clone of the
//! socket.

use std::io::{ErrorKind, Read, Write};
use std::net::Shutdown;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::Duration;

use crate::common::{listener_and_client, started, wait_until, Counted, LIMIT};
use fibra::net::unix::UnixStream;
use fibra::net::{TcpListener, TcpStream};
use fibra::WhenReadableError;

/// Reads what `s` has once it is readable, in a continuation; sends it on `tx`.
fn read_later(s: TcpStream, tx: mpsc::Sender<Vec<u8>>) {
    s.spawn_when_readable(move |s| {
        let mut buf = [0u8; 64];
        let n = s.try_read(&mut buf).expect("readable");
        tx.send(buf[..n].to_vec()).expect("test waits");
    })
    .expect("registered");
}

#[test]
fn a_continuation_runs_when_data_arrives_and_holds_no_stack_meanwhile() {
    crate::common::with_deadline(|| {
        let sched = started(2);
        let (listener, mut client) = listener_and_client();
        let (tx, rx) = mpsc::channel();
        let h = sched.spawn(move || {
            let (s, _) = listener.accept().expect("accept");
            let mut buf = [0u8; 8];
            assert_eq!(
                s.try_read(&mut buf).unwrap_err().kind(),
                ErrorKind::WouldBlock
            );
            read_later(s, tx);
        });
        crate::common::finish(h);
        // The accepting fiber ended: only the continuation is alive, and it has no stack.
        wait_until("only the continuation is live, with no stack", || {
            let m = sched.metrics();
            m.live_tasks() == 1 && m.stacks_in_use() == 0
        });
        let m = sched.metrics();
        assert_eq!(m.continuations(), 1);
        assert!(m.to_string().contains("(1 readiness continuations)"), "{m}");
        let dump = sched.dump().to_string();
        assert!(
            dump.contains("1 readiness continuations: waiting"),
            "{dump}"
        );
        assert!(!dump.contains("more tasks"), "{dump}");
        assert!(
            rx.recv_timeout(Duration::from_millis(50)).is_err(),
            "ran before any data"
        );
        client.write_all(b"hello").unwrap();
        assert_eq!(rx.recv_timeout(LIMIT).expect("ran"), b"hello");
        wait_until("the task ends", || sched.metrics().live_tasks() == 0);
        assert_eq!(sched.metrics().continuations(), 0);
        sched.stop();
    });
}

#[test]
fn a_readable_socket_submits_at_once() {
    crate::common::with_deadline(|| {
        let sched = started(1);
        let (listener, mut client) = listener_and_client();
        client.write_all(b"already").unwrap();
        let (tx, rx) = mpsc::channel();
        sched.spawn(move || {
            let (s, _) = listener.accept().expect("accept");
            // Wait until the bytes are in the socket, without reading them.
            let mut peek = [0u8; 7];
            while s.peek(&mut peek).unwrap() < 7 {
                fibra::sleep(Duration::from_millis(1));
            }
            read_later(s, tx);
        });
        assert_eq!(rx.recv_timeout(LIMIT).expect("ran"), b"already");
        sched.stop();
    });
}

#[test]
fn a_hang_up_runs_it_and_the_read_says_end_of_file() {
    crate::common::with_deadline(|| {
        let sched = started(2);
        let (listener, client) = listener_and_client();
        let (tx, rx) = mpsc::channel();
        sched.spawn(move || {
            let (s, _) = listener.accept().expect("accept");
            s.spawn_when_readable(move |s| {
                let mut buf = [0u8; 8];
                tx.send(s.try_read(&mut buf).expect("end of file")).unwrap();
            })
            .expect("registered");
        });
        wait_until("registered", || sched.metrics().live_tasks() == 1);
        drop(client);
        assert_eq!(rx.recv_timeout(LIMIT).expect("ran"), 0);
        sched.stop();
    });
}

#[test]
fn outside_a_fiber_the_socket_and_closure_come_back_usable() {
    crate::common::with_deadline(|| {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let s = TcpStream::connect(listener.local_addr().unwrap()).expect("connect");
        let (mut peer, _) = listener.accept().unwrap();
        let ran = Arc::new(AtomicUsize::new(0));
        let r = ran.clone();
        let err = s
            .spawn_when_readable(move |_| {
                r.fetch_add(1, Ordering::SeqCst);
            })
            .expect_err("no scheduler on a plain thread");
        assert!(matches!(err, WhenReadableError::NoScheduler(..)), "{err:?}");
        assert!(err.to_string().contains("outside a fiber"), "{err}");
        let (mut s, f) = err.into_inner();
        // The socket still works, and the closure is intact.
        peer.write_all(b"ok").unwrap();
        let mut buf = [0u8; 2];
        s.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"ok");
        f(s);
        assert_eq!(ran.load(Ordering::SeqCst), 1);
    });
}

#[test]
fn stop_waits_for_a_pending_continuation_like_a_parked_fiber() {
    crate::common::with_deadline(|| {
        let sched = Arc::new(started(2));
        let (listener, mut client) = listener_and_client();
        let (tx, rx) = mpsc::channel();
        sched.spawn(move || read_later(listener.accept().expect("accept").0, tx));
        wait_until("registered", || sched.metrics().live_tasks() == 1);
        let s = sched.clone();
        let stopper = thread::spawn(move || s.stop());
        thread::sleep(Duration::from_millis(100));
        assert!(
            !stopper.is_finished(),
            "stop returned while a continuation was pending"
        );
        client.write_all(b"late").unwrap();
        assert_eq!(rx.recv_timeout(LIMIT).expect("ran during stop"), b"late");
        stopper.join().expect("stop returns once it ran");
    });
}

/// Sets its counter when dropped, and panics doing so if asked.
struct Guard {
    _dropped: Counted,
    panic: bool,
}

impl Drop for Guard {
    fn drop(&mut self) {
        if self.panic {
            panic!("a capture that panics in Drop");
        }
    }
}

#[test]
fn stop_timeout_drops_continuations_that_never_fire_even_if_dropping_panics() {
    crate::common::with_deadline(|| {
        let sched = started(2);
        let drops = Arc::new(AtomicUsize::new(0));
        let ran = Arc::new(AtomicUsize::new(0));
        let mut clients = Vec::new();
        for panic in [false, true] {
            let (listener, client) = listener_and_client();
            clients.push(client);
            let (drops, ran) = (drops.clone(), ran.clone());
            sched.spawn(move || {
                let guard = Guard {
                    _dropped: Counted(drops),
                    panic,
                };
                let (s, _) = listener.accept().expect("accept");
                s.spawn_when_readable(move |_| {
                    let _keep = guard;
                    ran.fetch_add(1, Ordering::SeqCst);
                })
                .expect("registered");
            });
        }
        wait_until("both registered", || sched.metrics().live_tasks() == 2);
        let cancelled = sched.stop_timeout(Duration::from_millis(50));
        assert_eq!(cancelled, 2, "both continuations count as cancelled");
        assert_eq!(drops.load(Ordering::SeqCst), 2, "each closure dropped once");
        assert_eq!(ran.load(Ordering::SeqCst), 0, "neither ran");
        // Dropping the closures closed their sockets: the clients see end of file.
        for mut c in clients {
            c.set_read_timeout(Some(LIMIT)).unwrap();
            let mut buf = [0u8; 1];
            assert_eq!(c.read(&mut buf).expect("end of file"), 0);
        }
    });
}

#[test]
fn a_fiber_cancelled_by_stop_timeout_gets_its_socket_back_from_a_late_registration() {
    crate::common::with_deadline(|| {
        let sched = started(1);
        let (listener, _client) = listener_and_client();
        let (tx, rx) = mpsc::channel();
        let (accepted_tx, accepted) = mpsc::channel();
        // A fiber that registers a continuation while it unwinds from its cancellation: the
        // scheduler is past waiting then, so it must be refused and get both back.
        struct OnUnwind(Option<TcpStream>, mpsc::Sender<String>);
        impl Drop for OnUnwind {
            fn drop(&mut self) {
                let s = self.0.take().expect("stream");
                let r = s.spawn_when_readable(|_| unreachable!("refused"));
                let msg = match r {
                    Err(e @ WhenReadableError::Stopped(..)) => {
                        let (s, _f) = e.into_inner();
                        format!("stopped {}", s.local_addr().is_ok())
                    }
                    other => format!("{other:?}"),
                };
                let _ = self.1.send(msg);
            }
        }
        sched.spawn(move || {
            let (s, _) = listener.accept().expect("accept");
            let _guard = OnUnwind(Some(s), tx);
            accepted_tx.send(()).unwrap();
            fibra::sleep(Duration::MAX);
        });
        accepted.recv_timeout(LIMIT).expect("accepted");
        assert_eq!(sched.stop_timeout(Duration::from_millis(20)), 1);
        assert_eq!(rx.recv_timeout(LIMIT).expect("unwound"), "stopped true");
    });
}

#[test]
fn a_panicking_continuation_ends_only_its_task() {
    crate::common::with_deadline(|| {
        let sched = started(2);
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = mpsc::channel();
        sched.spawn(move || {
            for i in 0..2 {
                let (s, _) = listener.accept().expect("accept");
                let tx = tx.clone();
                s.spawn_when_readable(move |s| {
                    if i == 0 {
                        panic!("continuation {i} panics");
                    }
                    let mut buf = [0u8; 8];
                    let n = s.try_read(&mut buf).unwrap();
                    tx.send(buf[..n].to_vec()).unwrap();
                })
                .expect("registered");
            }
        });
        let mut a = std::net::TcpStream::connect(addr).unwrap();
        let mut b = std::net::TcpStream::connect(addr).unwrap();
        a.write_all(b"boom").unwrap();
        wait_until("the panicking task ended", || {
            sched.metrics().live_tasks() == 1
        });
        b.write_all(b"fine").unwrap();
        assert_eq!(rx.recv_timeout(LIMIT).expect("second ran"), b"fine");
        sched.stop();
    });
}

#[test]
fn a_leftover_readiness_runs_it_once_for_nothing_then_it_waits_again() {
    crate::common::with_deadline(|| {
        let sched = started(1);
        let (listener, mut client) = listener_and_client();
        let runs = Arc::new(AtomicUsize::new(0));
        let (tx, rx) = mpsc::channel();
        client.write_all(b"first").unwrap();
        let r = runs.clone();
        sched.spawn(move || {
            let (mut s, _) = listener.accept().expect("accept");
            let mut buf = [0u8; 5];
            // A blocking read consumes the data but leaves the readiness remembered.
            s.read_exact(&mut buf).unwrap();
            fn again(s: TcpStream, runs: Arc<AtomicUsize>, tx: mpsc::Sender<Vec<u8>>) {
                s.spawn_when_readable(move |s| {
                    runs.fetch_add(1, Ordering::SeqCst);
                    let mut buf = [0u8; 16];
                    match s.try_read(&mut buf) {
                        Ok(n) => tx.send(buf[..n].to_vec()).unwrap(),
                        Err(e) if e.kind() == ErrorKind::WouldBlock => again(s, runs, tx),
                        Err(e) => panic!("{e}"),
                    }
                })
                .expect("registered");
            }
            again(s, r, tx);
        });
        wait_until("waiting", || {
            sched.metrics().live_tasks() == 1 && runs.load(Ordering::SeqCst) <= 1
        });
        thread::sleep(Duration::from_millis(20));
        let before = runs.load(Ordering::SeqCst);
        assert!(before <= 1, "ran {before} times without data");
        client.write_all(b"second").unwrap();
        assert_eq!(rx.recv_timeout(LIMIT).expect("ran"), b"second");
        assert_eq!(runs.load(Ordering::SeqCst), before + 1);
        sched.stop();
    });
}

/// An echo server in continuation style: each readiness is a new task.
fn echo(s: TcpStream) {
    let mut buf = [0u8; 256];
    loop {
        match s.try_read(&mut buf) {
            Ok(0) => return,
            Ok(n) => (&s).write_all(&buf[..n]).expect("echo"),
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                s.spawn_when_readable(echo).expect("registered");
                return;
            }
            Err(e) => panic!("{e}"),
        }
    }
}

#[test]
fn many_connections_served_as_chains_of_continuations_get_every_answer() {
    const CONNS: usize = 64;
    const ROUNDS: usize = 50;
    crate::common::with_deadline(|| {
        let sched = started(2);
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().unwrap();
        sched.spawn(move || {
            for _ in 0..CONNS {
                let (s, _) = listener.accept().expect("accept");
                fibra::spawn(move || echo(s));
            }
        });
        let clients: Vec<_> = (0..CONNS)
            .map(|i| {
                thread::spawn(move || {
                    let mut c = std::net::TcpStream::connect(addr).unwrap();
                    c.set_read_timeout(Some(LIMIT)).unwrap();
                    for r in 0..ROUNDS {
                        let msg = format!("{i}:{r};");
                        c.write_all(msg.as_bytes()).unwrap();
                        let mut back = vec![0u8; msg.len()];
                        c.read_exact(&mut back).unwrap();
                        assert_eq!(back, msg.as_bytes());
                    }
                    c.shutdown(Shutdown::Write).unwrap();
                })
            })
            .collect();
        for c in clients {
            c.join().expect("client");
        }
        wait_until("every chain ended", || sched.metrics().live_tasks() == 0);
        sched.stop();
    });
}

#[test]
fn unix_streams_have_them_too() {
    crate::common::with_deadline(|| {
        let sched = started(2);
        let (a, b) = UnixStream::pair().expect("pair");
        let (tx, rx) = mpsc::channel();
        let (registered_tx, registered) = mpsc::channel();
        sched.spawn(move || {
            let mut buf = [0u8; 8];
            assert_eq!(
                b.try_read(&mut buf).unwrap_err().kind(),
                ErrorKind::WouldBlock
            );
            b.spawn_when_readable(move |b| {
                let mut buf = [0u8; 8];
                let n = b.try_read(&mut buf).unwrap();
                assert_eq!(b.try_write(b"pong").unwrap(), 4);
                tx.send(buf[..n].to_vec()).unwrap();
            })
            .expect("registered");
            registered_tx.send(()).unwrap();
        });
        registered.recv_timeout(LIMIT).expect("registered");
        let mut a = a;
        a.write_all(b"ping").unwrap();
        assert_eq!(rx.recv_timeout(LIMIT).expect("ran"), b"ping");
        let mut back = [0u8; 4];
        a.read_exact(&mut back).unwrap();
        assert_eq!(&back, b"pong");
        sched.stop();
    });
}

#[test]
fn an_idle_timeout_is_a_shutdown_of_a_clone() {
    crate::common::with_deadline(|| {
        let sched = started(2);
        let (listener, mut client) = listener_and_client();
        let (tx, rx) = mpsc::channel();
        sched.spawn(move || {
            let (s, _) = listener.accept().expect("accept");
            let timeout_handle = s.try_clone().expect("try_clone");
            s.spawn_when_readable(move |s| {
                let mut buf = [0u8; 8];
                tx.send(s.try_read(&mut buf).map_err(|e| e.kind())).unwrap();
            })
            .expect("registered");
            // The idle timeout: shut the socket down through the clone, which the
            // continuation sees as end of file.
            fibra::sleep(Duration::from_millis(20));
            timeout_handle.shutdown(Shutdown::Read).unwrap();
        });
        assert_eq!(rx.recv_timeout(LIMIT).expect("ran"), Ok(0));
        // The client can still tell: its next write is not read by anyone.
        client.write_all(b"late").unwrap();
        sched.stop();
    });
}

#[test]
fn a_chain_goes_on_registering_during_a_waiting_stop() {
    crate::common::with_deadline(|| {
        let sched = Arc::new(started(2));
        let (listener, mut client) = listener_and_client();
        sched.spawn(move || echo(listener.accept().expect("accept").0));
        wait_until("registered", || sched.metrics().continuations() == 1);
        let s = sched.clone();
        let stopper = thread::spawn(move || s.stop());
        thread::sleep(Duration::from_millis(50));
        // Each request is answered by a task that registers again, during the stop.
        client.set_read_timeout(Some(LIMIT)).unwrap();
        for round in 0..3 {
            client.write_all(b"more").unwrap();
            let mut back = [0u8; 4];
            client.read_exact(&mut back).unwrap();
            assert_eq!(&back, b"more", "round {round}");
            assert!(!stopper.is_finished(), "stop returned with the chain alive");
        }
        drop(client); // end of file: the chain ends, and stop returns
        stopper.join().expect("stop returns once the chain ended");
    });
}
