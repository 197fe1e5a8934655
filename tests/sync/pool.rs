//! `fibra::sync::Pool`: never more than `max_size` connections, none held by two users or
//! lost, waiters served in arrival order from fibers and threads alike, a wait that parks
//! only its fiber (a `connect` that parks too), timeouts, broken connections replaced,
//! a restarted server's stale connections replaced at checkout without a failed checkout,
//! `connect` retried until the timeout, `try_get`, the builder's checks, and a
//! `has_broken` that panics.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use crate::common::{finish, started, LIMIT};
use fibra::sync::{ManageConnection, Pool, PoolError};

/// A connection: its number, the server generation it was opened in, and whether someone
/// holds it (to catch a double handout).
struct Conn {
    id: u32,
    generation: u32,
    held: Arc<AtomicBool>,
    broken: bool,
}

/// A pretend server that can be down (connects fail) and restarted (every older connection
/// fails `is_valid`); the test keeps a handle to it while the pool owns the manager.
#[derive(Default)]
struct Server {
    made: AtomicU32,
    generation: AtomicU32,
    down: AtomicBool,
    /// Connects that fail before one succeeds.
    fail_first: AtomicU32,
    /// `connect` parks its fiber until a permit of this gate is released (a hooked connect
    /// waiting for the server).
    gate: Option<fibra::sync::Semaphore>,
    panic_in_has_broken: AtomicBool,
}

/// The manager: connections to a `Server`.
#[derive(Default, Clone)]
struct Fake(Arc<Server>);

impl Fake {
    fn with(server: Server) -> (Fake, Arc<Server>) {
        let s = Arc::new(server);
        (Fake(s.clone()), s)
    }
}

impl std::ops::Deref for Fake {
    type Target = Server;
    fn deref(&self) -> &Server {
        &self.0
    }
}

impl ManageConnection for Fake {
    type Connection = Conn;
    type Error = std::io::Error;
    fn connect(&self) -> std::io::Result<Conn> {
        if let Some(gate) = &self.gate {
            gate.acquire().forget();
        }
        if self.down.load(SeqCst)
            || self
                .fail_first
                .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1))
                .is_ok()
        {
            return Err(std::io::Error::new(
                std::io::ErrorKind::ConnectionRefused,
                "server down",
            ));
        }
        Ok(Conn {
            id: self.made.fetch_add(1, SeqCst),
            generation: self.generation.load(SeqCst),
            held: Arc::new(AtomicBool::new(false)),
            broken: false,
        })
    }
    fn is_valid(&self, c: &mut Conn) -> std::io::Result<()> {
        if c.generation == self.generation.load(SeqCst) {
            Ok(())
        } else {
            Err(std::io::Error::new(
                std::io::ErrorKind::BrokenPipe,
                "the server restarted",
            ))
        }
    }
    fn has_broken(&self, c: &mut Conn) -> bool {
        if self.panic_in_has_broken.load(SeqCst) {
            panic!("has_broken panicked");
        }
        c.broken
    }
}

/// Holds `c` for a moment, checking nobody else holds it.
fn use_conn(c: &Conn) {
    assert!(
        !c.held.swap(true, SeqCst),
        "connection {} handed out twice",
        c.id
    );
    fibra::Fiber::yield_now();
    fibra::sleep(Duration::from_micros(50));
    c.held.store(false, SeqCst);
}

#[test]
fn many_fibers_and_threads_share_a_few_connections_none_twice_none_lost() {
    crate::common::with_deadline(|| {
        let sched = started(2);
        let pool = Pool::builder()
            .max_size(3)
            .build(Fake::default())
            .expect("built");
        assert_eq!(pool.state().connections, 3, "max_size opened up front");
        let in_use = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let user = {
            let (pool, in_use, most) = (pool.clone(), in_use.clone(), most.clone());
            move || {
                for _ in 0..5 {
                    let c = pool.get().expect("a connection");
                    most.fetch_max(in_use.fetch_add(1, SeqCst) + 1, SeqCst);
                    use_conn(&c);
                    in_use.fetch_sub(1, SeqCst);
                }
            }
        };
        let fibers: Vec<_> = (0..200).map(|_| sched.spawn(user.clone())).collect();
        let threads: Vec<_> = (0..4).map(|_| std::thread::spawn(user.clone())).collect();
        for f in fibers {
            finish(f);
        }
        for t in threads {
            t.join().expect("thread user");
        }
        assert!(
            most.load(SeqCst) <= 3,
            "{} in use at once",
            most.load(SeqCst)
        );
        let s = pool.state();
        assert_eq!((s.connections, s.idle_connections), (3, 3), "none lost");
        assert_eq!(pool.max_size(), 3);
        sched.stop();
    });
}

#[test]
fn waiters_are_served_in_arrival_order() {
    crate::common::with_deadline(|| {
        let sched = started(2);
        let pool = Pool::builder().max_size(1).build(Fake::default()).unwrap();
        let held = pool.get().unwrap();
        let order = Arc::new(StdMutex::new(Vec::new()));
        let mut waiters = Vec::new();
        for i in 0..8 {
            let (pool, order) = (pool.clone(), order.clone());
            waiters.push(sched.spawn(move || {
                let _c = pool.get().expect("served");
                order.lock().unwrap().push(i);
            }));
            // Each one waits before the next arrives.
            crate::common::wait_until("the waiter queues", || {
                sched
                    .metrics()
                    .workers()
                    .iter()
                    .map(|w| w.parks())
                    .sum::<u64>()
                    > i
            });
            std::thread::sleep(Duration::from_millis(2));
        }
        drop(held);
        for w in waiters {
            finish(w);
        }
        assert_eq!(*order.lock().unwrap(), (0..8).collect::<Vec<u64>>());
        sched.stop();
    });
}

/// On a single worker: one fiber's `connect` parks until the test lets the server answer,
/// and another fiber waits for the pool's only permit meanwhile. The worker must still run
/// other fibers; then both checkouts complete.
#[test]
fn a_wait_or_a_connect_parks_only_its_fiber() {
    crate::common::with_deadline(|| {
        let sched = started(1);
        let (fake, server) = Fake::with(Server {
            gate: Some(fibra::sync::Semaphore::new(0)),
            ..Server::default()
        });
        let pool = Pool::builder().max_size(1).build_unchecked(fake);
        let users: Vec<_> = (0..2)
            .map(|_| {
                let pool = pool.clone();
                sched.spawn(move || pool.get().expect("a connection").id)
            })
            .collect();
        crate::common::wait_until("both parked", || sched.metrics().workers()[0].parks() >= 2);
        assert_eq!(sched.block_on(|| 7), 7, "the worker runs other fibers");
        server.gate.as_ref().unwrap().release(1);
        for u in users {
            assert_eq!(
                finish(u),
                0,
                "one connection, made once, used by both in turn"
            );
        }
        sched.stop();
    });
}

#[test]
fn a_checkout_times_out_from_a_fiber_and_a_thread() {
    crate::common::with_deadline(|| {
        let sched = started(1);
        let pool = Pool::builder()
            .max_size(1)
            .connection_timeout(Duration::from_millis(30))
            .build(Fake::default())
            .unwrap();
        let held = pool.get().unwrap();
        let p = pool.clone();
        let from_fiber = sched.spawn(move || {
            let t = Instant::now();
            (p.get().map(|_| ()), t.elapsed())
        });
        let (r, took) = finish(from_fiber);
        assert_eq!(r.unwrap_err(), PoolError::Timeout { last_error: None });
        assert!(took >= Duration::from_millis(30));
        let e = pool.get_timeout(Duration::ZERO).unwrap_err();
        assert!(e.to_string().contains("timed out"), "{e}");
        drop(held);
        assert!(pool.get_timeout(Duration::ZERO).is_ok(), "free again");
        sched.stop();
    });
}

#[test]
fn a_broken_connection_is_dropped_and_replaced() {
    let pool = Pool::builder().max_size(2).build(Fake::default()).unwrap();
    let mut c = pool.get().unwrap();
    c.broken = true;
    let broken_id = c.id;
    drop(c);
    assert_eq!(pool.state().connections, 1, "the broken one is gone");
    let a = pool.get().unwrap();
    let b = pool.get().unwrap();
    assert!(a.id != broken_id && b.id != broken_id);
    assert_eq!(pool.state().connections, 2, "a new one replaced it");
}

/// The server restarts: every pooled connection is stale. With `test_on_check_out`, each
/// checkout finds the stale ones, drops them and opens a new one: no checkout fails.
#[test]
fn after_a_restart_stale_connections_are_replaced_at_checkout() {
    crate::common::with_deadline(|| {
        let sched = started(2);
        let (fake, server) = Fake::with(Server::default());
        let pool = Pool::builder().max_size(4).build(fake).unwrap();
        server.generation.store(1, SeqCst);
        let users: Vec<_> = (0..40)
            .map(|_| {
                let pool = pool.clone();
                sched.spawn(move || {
                    let c = pool.get().expect("no checkout fails after a restart");
                    assert_eq!(c.generation, 1, "a stale connection was handed out");
                    use_conn(&c);
                })
            })
            .collect();
        for u in users {
            finish(u);
        }
        let s = pool.state();
        assert!(
            s.connections <= 4 && s.connections == s.idle_connections,
            "{s:?}"
        );
        assert_eq!(server.made.load(SeqCst), 4 + s.connections);
        sched.stop();
    });
}

/// While the server is down, a checkout retries `connect` until its timeout and reports the
/// last error; once the server is back, a checkout that began while it was down succeeds.
#[test]
fn connect_is_retried_until_the_timeout() {
    crate::common::with_deadline(|| {
        let sched = started(1);
        let (fake, server) = Fake::with(Server::default());
        server.down.store(true, SeqCst);
        let pool = Pool::builder()
            .max_size(2)
            .connection_timeout(Duration::from_millis(50))
            .build_unchecked(fake);
        let p = pool.clone();
        let e = finish(sched.spawn(move || p.get().map(|_| ()).unwrap_err()));
        assert_eq!(
            e,
            PoolError::Timeout {
                last_error: Some("server down".into())
            }
        );
        assert_eq!(
            pool.state().connections,
            0,
            "failed connects are not counted"
        );
        // Up again after three more refusals.
        server.fail_first.store(3, SeqCst);
        server.down.store(false, SeqCst);
        let p = pool.clone();
        let id = finish(sched.spawn(move || p.get_timeout(LIMIT).expect("retried").id));
        assert_eq!(id, 0);
        // `build` fails the same way when the first connections cannot be opened.
        let (fake, server) = Fake::with(Server::default());
        server.down.store(true, SeqCst);
        let e = Pool::builder()
            .connection_timeout(Duration::from_millis(20))
            .build(fake)
            .unwrap_err();
        assert!(e.to_string().contains("server down"), "{e}");
        sched.stop();
    });
}

#[test]
fn try_get_takes_only_an_idle_connection() {
    let pool = Pool::builder()
        .max_size(2)
        .min_idle(Some(1))
        .build(Fake::default())
        .unwrap();
    assert_eq!(pool.state().connections, 1, "min_idle opened");
    let a = pool.try_get().expect("the idle one");
    assert!(pool.try_get().is_none(), "none idle: no connect");
    let b = pool.get().unwrap();
    assert!(pool.try_get().is_none(), "all permits taken");
    drop((a, b));
    assert_eq!(pool.state().idle_connections, 2);
}

#[test]
fn the_builder_refuses_what_cannot_work() {
    assert_eq!(
        Pool::builder()
            .max_size(0)
            .build(Fake::default())
            .unwrap_err(),
        PoolError::InvalidConfig("max_size must be at least 1")
    );
    let e = Pool::builder()
        .max_size(2)
        .min_idle(Some(3))
        .build(Fake::default())
        .unwrap_err();
    assert!(e.to_string().contains("min_idle"), "{e}");
    let r =
        std::panic::catch_unwind(|| Pool::builder().max_size(0).build_unchecked(Fake::default()));
    assert!(r.is_err());
}

/// A `has_broken` that panics while a connection comes back: the panic reaches the dropper,
/// and the pool loses neither the permit nor its count.
#[test]
fn a_panicking_has_broken_loses_nothing() {
    let (fake, server) = Fake::with(Server::default());
    let pool = Pool::builder().max_size(1).build(fake).unwrap();
    let c = pool.get().unwrap();
    server.panic_in_has_broken.store(true, SeqCst);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(c)));
    assert!(r.is_err(), "the panic reaches the dropper");
    server.panic_in_has_broken.store(false, SeqCst);
    assert_eq!(
        pool.state().connections,
        0,
        "the connection counted as broken"
    );
    let c = pool
        .get_timeout(Duration::ZERO)
        .expect("the permit came back");
    assert_eq!(c.id, 1);
}
