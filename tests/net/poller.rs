//! The reactor's poller role across schedulers: it is one per process, so the worker that
//! polls may belong to another scheduler. When that worker's thread leaves its loop (its
//! scheduler stopped), the I/O waiters of the others (parked fibers, readiness
//! continuations) must still be woken by their data.

use std::io::{Read, Write};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use crate::common::{listener_and_client, started, LIMIT};

/// Scheduler `b`'s worker holds the poller role while `a`'s worker sleeps on its futex; then
/// `b` stops. `a`'s I/O waiter, set up by `wait` (which gets the accepted socket and the
/// channel for what it reads, and must be waiting when it returns), must still be woken when
/// its data comes: the exiting poller hands the role to a sleeping worker of any scheduler.
fn a_stopped_schedulers_poller_hands_over(
    wait: impl FnOnce(fibra::net::TcpStream, mpsc::Sender<Vec<u8>>) + Send + 'static,
) {
    // `b` first, with nothing to do: its idle worker takes the poller role and keeps it.
    let b = started(1);
    let (role_tx, role) = mpsc::channel();
    b.spawn(move || {
        // A wait that times out makes sure the reactor exists, so the idle worker polls.
        let (l, _c) = listener_and_client();
        let (s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_millis(1))).unwrap();
        assert!((&s).read(&mut [0u8; 1]).is_err());
        role_tx.send(()).unwrap()
    });
    role.recv_timeout(LIMIT).unwrap();
    thread::sleep(Duration::from_millis(20));
    let a = started(1);
    let (listener, mut client) = listener_and_client();
    let (tx, rx) = mpsc::channel();
    let (waiting_tx, waiting) = mpsc::channel();
    a.spawn(move || {
        let (s, _) = listener.accept().expect("accept");
        waiting_tx.send(()).unwrap();
        wait(s, tx);
    });
    waiting.recv_timeout(LIMIT).unwrap();
    // Whichever worker polls now, give the role to `b`'s: keep `a`'s worker busy (a fiber
    // that spins without suspending, so that worker cannot poll) while `b`'s wakes for a
    // task and, going idle again, finds the role free. When `a`'s worker is done, the role
    // is taken: it sleeps on its futex.
    let (spinning_tx, spinning) = mpsc::channel();
    let spin = a.spawn(move || {
        spinning_tx.send(()).unwrap();
        let end = std::time::Instant::now() + Duration::from_millis(200);
        while std::time::Instant::now() < end {
            std::hint::spin_loop();
        }
    });
    spinning.recv_timeout(LIMIT).unwrap();
    b.spawn(|| ()).join().expect("no-op task");
    spin.join().expect("spinning fiber");
    thread::sleep(Duration::from_millis(50));
    b.stop();
    client.write_all(b"data").unwrap();
    let woke = rx.recv_timeout(Duration::from_secs(5));
    assert_eq!(woke.expect("woken within 5 s of its data"), b"data");
    a.stop();
}

#[test]
fn a_stopped_schedulers_poller_hands_over_to_a_parked_fiber() {
    crate::common::with_deadline(|| {
        a_stopped_schedulers_poller_hands_over(|mut s, tx| {
            let mut buf = [0u8; 8];
            let n = s.read(&mut buf).unwrap();
            tx.send(buf[..n].to_vec()).unwrap();
        })
    });
}

#[test]
fn a_stopped_schedulers_poller_hands_over_to_a_continuation() {
    crate::common::with_deadline(|| {
        a_stopped_schedulers_poller_hands_over(|s, tx| {
            s.spawn_when_readable(move |s| {
                let mut buf = [0u8; 8];
                let n = s.try_read(&mut buf).unwrap();
                tx.send(buf[..n].to_vec()).unwrap();
            })
            .expect("registered");
        })
    });
}
