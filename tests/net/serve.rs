//! `TcpStream::serve`, `UnixStream::serve` and `TcpListener::serve`: a connection served as
//! turns of a handler, each a fresh task when the socket turns readable. The handler's state
//! lives on between turns, a waiting connection holds no stack but counts as live, `Close`
//! and a panic end that connection alone, a turn may block, unread data starts the next turn
//! at once, a refusal hands socket and handler back, `stop_timeout` drops a waiting
//! connection (closing it), and the accept loop ends when its fiber is cancelled.

use std::io::{ErrorKind, Read, Write};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use crate::common::{listener_and_client, started, wait_until, Counted, LIMIT};
use fibra::net::unix::UnixStream;
use fibra::net::{Serve, TcpListener, TcpStream};
use fibra::WhenReadableError;

/// A handler that answers each complete line with its number and the line's length, keeping
/// a partial line and the count between turns.
fn line_counter() -> impl FnMut(&mut TcpStream) -> Serve + Send + 'static {
    let mut pending = Vec::new();
    let mut lines = 0usize;
    move |s: &mut TcpStream| {
        let mut buf = [0u8; 16];
        loop {
            match s.try_read(&mut buf) {
                Ok(0) => return Serve::Close,
                Ok(n) => pending.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Serve::Again,
                Err(_) => return Serve::Close,
            }
            while let Some(i) = pending.iter().position(|&b| b == b'\n') {
                lines += 1;
                let reply = format!("{lines}:{i}\n");
                pending.drain(..=i);
                if s.write_all(reply.as_bytes()).is_err() {
                    return Serve::Close;
                }
            }
        }
    }
}

/// A handler that echoes what has come (a `!` first panics, as a handler's bug would).
fn echo(s: &mut TcpStream) -> Serve {
    let mut buf = [0u8; 8];
    match s.try_read(&mut buf) {
        Ok(n) if n > 0 && buf[0] == b'!' => panic!("a handler's bug"),
        Ok(n) if n > 0 => {
            s.write_all(&buf[..n]).unwrap();
            Serve::Again
        }
        Err(e) if e.kind() == ErrorKind::WouldBlock => Serve::Again,
        _ => Serve::Close,
    }
}

fn read_line(c: &mut std::net::TcpStream) -> String {
    let mut out = Vec::new();
    let mut b = [0u8; 1];
    while c.read(&mut b).expect("a reply") == 1 {
        if b[0] == b'\n' {
            break;
        }
        out.push(b[0]);
    }
    String::from_utf8(out).unwrap()
}

#[test]
fn the_handlers_state_lives_on_across_turns_and_a_waiting_connection_holds_no_stack() {
    crate::common::with_deadline(|| {
        let sched = started(2);
        let (listener, mut client) = listener_and_client();
        client.set_read_timeout(Some(LIMIT)).unwrap();
        sched.spawn(move || {
            let (s, _) = listener.accept().expect("accept");
            s.serve(line_counter()).expect("served");
        });
        for round in 1..=20 {
            // A line split across writes: the first half's turn keeps it.
            client.write_all(b"hel").unwrap();
            std::thread::sleep(Duration::from_millis(1));
            client.write_all(b"lo\n").unwrap();
            assert_eq!(read_line(&mut client), format!("{round}:5"));
        }
        wait_until("only the waiting connection is live, with no stack", || {
            let m = sched.metrics();
            m.live_tasks() == 1 && m.stacks_in_use() == 0 && m.continuations() == 1
        });
        // A hang-up runs a last turn, which reads end of file and closes.
        drop(client);
        wait_until("the connection ends", || sched.metrics().live_tasks() == 0);
        sched.stop();
    });
}

#[test]
fn many_connections_over_two_workers_each_get_every_answer() {
    crate::common::with_deadline(|| {
        let sched = started(2);
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().unwrap();
        let server = sched.spawn(move || {
            listener.serve(|conn, _| {
                conn.set_nodelay(true).unwrap();
                Some(line_counter())
            })
        });
        let clients: Vec<_> = (0..16)
            .map(|_| {
                std::thread::spawn(move || {
                    let mut c = std::net::TcpStream::connect(addr).unwrap();
                    c.set_read_timeout(Some(LIMIT)).unwrap();
                    for round in 1..=50 {
                        c.write_all(&vec![b'x'; round % 7][..]).unwrap();
                        c.write_all(b"\n").unwrap();
                        assert_eq!(read_line(&mut c), format!("{round}:{}", round % 7));
                    }
                })
            })
            .collect();
        for c in clients {
            c.join().expect("every answer right");
        }
        server.cancel();
        assert!(
            server.join().is_err_and(|e| e.is_cancelled()),
            "the accept loop ends when cancelled"
        );
        sched.stop();
    });
}

#[test]
fn close_ends_the_connection_and_drops_the_handler() {
    crate::common::with_deadline(|| {
        let sched = started(1);
        let (listener, mut client) = listener_and_client();
        client.set_read_timeout(Some(LIMIT)).unwrap();
        let drops = Arc::new(AtomicUsize::new(0));
        let d = drops.clone();
        sched.spawn(move || {
            let (s, _) = listener.accept().expect("accept");
            let counted = Counted(d);
            s.serve(move |s| {
                let _keep = &counted;
                let mut buf = [0u8; 8];
                let n = s.try_read(&mut buf).unwrap_or(0);
                s.write_all(&buf[..n]).unwrap();
                Serve::Close
            })
            .expect("served");
        });
        client.write_all(b"bye").unwrap();
        let mut got = Vec::new();
        client
            .read_to_end(&mut got)
            .expect("end of file after the reply");
        assert_eq!(got, b"bye");
        wait_until("the handler dropped", || drops.load(Ordering::SeqCst) == 1);
        assert_eq!(sched.metrics().live_tasks(), 0);
        sched.stop();
    });
}

#[test]
fn a_turn_may_block_and_unread_data_starts_the_next_turn_at_once() {
    crate::common::with_deadline(|| {
        let sched = started(2);
        let (listener, mut client) = listener_and_client();
        client.set_read_timeout(Some(LIMIT)).unwrap();
        sched.spawn(move || {
            let (s, _) = listener.accept().expect("accept");
            // One byte per turn, with a sleep in each: the rest of a write is left unread,
            // and must start the next turn without any new data.
            s.serve(|s| {
                let mut b = [0u8; 1];
                match s.try_read(&mut b) {
                    Ok(1) => {
                        fibra::sleep(Duration::from_millis(1));
                        s.write_all(&[b[0].to_ascii_uppercase()]).unwrap();
                        Serve::Again
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => Serve::Again,
                    _ => Serve::Close,
                }
            })
            .expect("served");
        });
        client.write_all(b"abcdef").unwrap();
        let mut got = [0u8; 6];
        client.read_exact(&mut got).expect("every byte answered");
        assert_eq!(&got, b"ABCDEF");
        sched.stop_timeout(Duration::from_millis(10));
    });
}

#[test]
fn a_panicking_turn_ends_only_its_connection() {
    crate::common::with_deadline(|| {
        let sched = started(2);
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().unwrap();
        let server = sched.spawn(move || listener.serve(|_, _| Some(echo)));
        let mut bad = std::net::TcpStream::connect(addr).unwrap();
        let mut good = std::net::TcpStream::connect(addr).unwrap();
        for c in [&bad, &good] {
            c.set_read_timeout(Some(LIMIT)).unwrap();
        }
        bad.write_all(b"!").unwrap();
        let mut rest = Vec::new();
        bad.read_to_end(&mut rest)
            .expect("the panicking turn's connection closes");
        assert!(rest.is_empty());
        good.write_all(b"ok").unwrap();
        let mut got = [0u8; 2];
        good.read_exact(&mut got)
            .expect("the other one still served");
        assert_eq!(&got, b"ok");
        server.cancel();
        assert!(server.join().is_err_and(|e| e.is_cancelled()));
        sched.stop_timeout(Duration::from_millis(10));
    });
}

#[test]
fn outside_a_fiber_the_socket_and_handler_come_back() {
    crate::common::with_deadline(|| {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let s = TcpStream::connect(listener.local_addr().unwrap()).expect("connect");
        let (mut peer, _) = listener.accept().unwrap();
        let err = s
            .serve(|_| -> Serve { unreachable!("never registered") })
            .expect_err("no scheduler on a plain thread");
        assert!(matches!(err, WhenReadableError::NoScheduler(..)), "{err:?}");
        assert!(err.to_string().contains("outside a fiber"), "{err}");
        let (s, _handler) = err.into_inner();
        (&s).write_all(b"usable").unwrap();
        let mut got = [0u8; 6];
        peer.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"usable");
        // And the accept loop refuses at once, accepting nothing.
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let e = l
            .serve(|_, _| Some(|_: &mut TcpStream| Serve::Close))
            .expect_err("outside a fiber");
        assert!(e.to_string().contains("outside a fiber"), "{e}");
    });
}

#[test]
fn stop_timeout_drops_a_waiting_connection_and_closes_it() {
    crate::common::with_deadline(|| {
        let sched = started(2);
        let (listener, mut client) = listener_and_client();
        let drops = Arc::new(AtomicUsize::new(0));
        let d = drops.clone();
        sched.spawn(move || {
            let (s, _) = listener.accept().expect("accept");
            let counted = Counted(d);
            s.serve(move |_| {
                let _keep = &counted;
                Serve::Again
            })
            .expect("served");
        });
        wait_until("waiting", || sched.metrics().continuations() == 1);
        assert_eq!(sched.stop_timeout(Duration::from_millis(20)), 1);
        assert_eq!(drops.load(Ordering::SeqCst), 1);
        client.set_read_timeout(Some(LIMIT)).unwrap();
        let mut b = [0u8; 1];
        assert_eq!(client.read(&mut b).expect("end of file"), 0);
    });
}

#[test]
fn the_accept_loop_closes_a_connection_it_gets_no_handler_for() {
    crate::common::with_deadline(|| {
        let sched = started(1);
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = mpsc::channel();
        let server = sched.spawn(move || {
            listener.serve(move |_, peer| {
                tx.send(peer).unwrap();
                None::<fn(&mut TcpStream) -> Serve>
            })
        });
        let mut c = std::net::TcpStream::connect(addr).unwrap();
        assert_eq!(rx.recv_timeout(LIMIT).unwrap(), c.local_addr().unwrap());
        c.set_read_timeout(Some(LIMIT)).unwrap();
        let mut b = [0u8; 1];
        assert_eq!(c.read(&mut b).expect("closed"), 0);
        server.cancel();
        assert!(server.join().is_err_and(|e| e.is_cancelled()));
        sched.stop();
    });
}

#[test]
fn a_unix_stream_is_served_the_same_way() {
    crate::common::with_deadline(|| {
        let sched = started(2);
        let (a, b) = UnixStream::pair().expect("pair");
        sched.spawn(move || {
            a.serve(|s| {
                let mut buf = [0u8; 8];
                match s.try_read(&mut buf) {
                    Ok(0) => Serve::Close,
                    Ok(n) => {
                        s.write_all(&buf[..n]).unwrap();
                        Serve::Again
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => Serve::Again,
                    Err(_) => Serve::Close,
                }
            })
            .expect("served");
        });
        let reply = sched.block_on(move || {
            let mut b = b;
            let mut out = Vec::new();
            for word in [&b"one"[..], b"two", b"three"] {
                b.write_all(word).unwrap();
                let mut got = vec![0u8; word.len()];
                b.read_exact(&mut got).unwrap();
                out.extend(got);
            }
            out
        });
        assert_eq!(reply, b"onetwothree");
        wait_until("the served end sees the hang-up", || {
            sched.metrics().live_tasks() == 0
        });
        sched.stop();
    });
}

/// Out of descriptors, the accept loop keeps going (backing off) and serves the pending
/// connection once a fiber of its own worker frees some.
#[test]
fn the_accept_loop_backs_off_on_emfile_and_serves_once_descriptors_free_up() {
    crate::common::child_ok(|| {
        let sched = started(1);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let mut client = std::net::TcpStream::connect(addr).unwrap();
        client.set_read_timeout(Some(LIMIT)).unwrap();
        let filler = crate::common::fill_descriptor_table(0);
        let accepted = Arc::new(AtomicUsize::new(0));
        sched.spawn(move || {
            fibra::sleep(Duration::from_millis(200));
            drop(filler);
        });
        let r = accepted.clone();
        sched.spawn(move || {
            listener.serve(move |_, _| {
                r.store(1, Ordering::SeqCst);
                Some(echo)
            })
        });
        client.write_all(b"ping").unwrap();
        let mut got = [0u8; 4];
        client
            .read_exact(&mut got)
            .expect("served after the descriptors came back");
        assert_eq!(&got, b"ping");
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
        sched.stop_timeout(Duration::from_millis(10));
    });
}
