//! The synchronous `redis` client, unmodified, in 1 000 fibers against a real
//! `redis-server`: with the `hook` feature its blocking socket calls park only their fiber.
//! Needs `redis-server` on the PATH; run with `cargo test -p fibra-interop --features redis-tests`.
#![cfg(feature = "redis-tests")]

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{finish, with_deadline};
use crate::redis_manager::RedisManager;
use redis::Commands;

/// A `redis-server` on a free loopback port, killed on drop.
struct Server {
    child: Child,
    port: u16,
}

impl Server {
    fn start() -> Server {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        Server::start_on(port)
    }

    /// A server on `port` (a restart, after `kill`).
    fn start_on(port: u16) -> Server {
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--maxclients", "4000"])
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server must be installed for --features redis-tests");
        let server = Server { child, port };
        let deadline = Instant::now() + crate::common::LIMIT;
        loop {
            if let Ok(mut c) = redis::Client::open(server.url()).and_then(|c| c.get_connection()) {
                if redis::cmd("PING")
                    .query::<String>(&mut c)
                    .is_ok_and(|p| p == "PONG")
                {
                    return server;
                }
            }
            assert!(Instant::now() < deadline, "redis-server did not come up");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// `kill -9`, and waits for the process to be gone.
    fn kill(mut self) -> u16 {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.port
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A fresh server, a client of it, and a started scheduler of two workers, with room for
/// a thousand connections.
fn server_and_scheduler() -> (Server, redis::Client, Arc<fibra::Scheduler>) {
    raise_fd_limit();
    let server = Server::start();
    let client = redis::Client::open(server.url()).unwrap();
    let sched = Arc::new(fibra::Scheduler::builder().threads(2).build().unwrap());
    sched.start();
    (server, client, sched)
}

/// Room for a thousand connections and more (the soft limit is often 1 024).
fn raise_fd_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a live rlimit to fill in and to set.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        lim.rlim_cur = lim.rlim_max.min(8192);
        libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
    }
}

#[test]
fn the_sync_redis_client_in_a_thousand_fibers_on_two_workers() {
    with_deadline(|| {
        let (_server, client, sched) = server_and_scheduler();
        // Every fiber blocks in BLPOP on its own list until the test thread pushes to it,
        // which it does only once the server reports all 1 000 clients blocked at once: on
        // two workers, only hooks let more than two fibers wait in a blocking call.
        let hs: Vec<_> = (0..1000u32)
            .map(|i| {
                let client = client.clone();
                sched
                    .submit(
                        move || {
                            let mut con = client.get_connection().unwrap();
                            let key = format!("fibra:hook:{i}");
                            let _: () = con.set(&key, format!("value {i}")).unwrap();
                            let woke: Option<(String, String)> =
                                con.blpop(format!("fibra:wake:{i}"), 60.0).unwrap();
                            assert_eq!(woke.map(|w| w.1), Some(i.to_string()));
                            let mut ok = 0;
                            for round in 0..5 {
                                let got: String = con.get(&key).unwrap();
                                assert_eq!(got, format!("value {i}"), "round {round}");
                                ok += 1;
                            }
                            let _: () = con.del(&key).unwrap();
                            ok
                        },
                        None,
                    )
                    .unwrap()
            })
            .collect();
        let mut con = client.get_connection().unwrap();
        let deadline = Instant::now() + crate::common::LIMIT;
        loop {
            let info: String = redis::cmd("INFO").arg("clients").query(&mut con).unwrap();
            let blocked: u32 = info
                .lines()
                .find_map(|l| l.strip_prefix("blocked_clients:"))
                .and_then(|n| n.trim().parse().ok())
                .unwrap();
            if blocked == 1000 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "only {blocked} of 1000 fibers are blocked in BLPOP at once"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut push = redis::pipe();
        for i in 0..1000u32 {
            push.rpush(format!("fibra:wake:{i}"), i.to_string())
                .ignore();
        }
        let _: () = push.query(&mut con).unwrap();
        let ok: u32 = hs.into_iter().map(finish).sum();
        assert_eq!(ok, 5000);
        // Nothing is left behind.
        let left: Vec<String> = con.keys("fibra:hook:*").unwrap();
        assert!(left.is_empty(), "{left:?}");
        sched.stop();
    });
}

/// 1 000 fibers on two workers increment one counter 5 times each through 8 pooled sync
/// connections; `kill -9` the server; checkouts fail cleanly (a timeout, no hang) while it
/// is down; restart it on the same port; 1 000 fibers again: no checkout fails (every stale
/// connection is found at its checkout and replaced) and every increment lands; then kill it
/// mid-load and restart it: at most one failed command per connection, no failed checkout.
/// The pool still holds at most 8 connections, all back.
#[test]
fn a_pool_of_eight_sync_connections_serves_a_thousand_fibers_across_a_server_restart() {
    with_deadline(|| {
        let (server, client, sched) = server_and_scheduler();
        let pool = fibra::sync::Pool::builder()
            .max_size(8)
            .connection_timeout(Duration::from_secs(2))
            .build(RedisManager(client.clone()))
            .expect("8 connections");
        let round = |key: &'static str| -> u32 {
            let hs: Vec<_> = (0..1000)
                .map(|_| {
                    let pool = pool.clone();
                    sched.spawn(move || {
                        let mut done = 0;
                        for _ in 0..5 {
                            let mut con = pool.get().expect("a checkout");
                            let _: i64 = con.incr(key, 1).expect("INCR");
                            done += 1;
                        }
                        done
                    })
                })
                .collect();
            hs.into_iter().map(finish).sum()
        };
        assert_eq!(round("fibra:pool:before"), 5000);
        let mut con = client.get_connection().unwrap();
        let n: i64 = con.get("fibra:pool:before").unwrap();
        assert_eq!(n, 5000);
        drop(con);
        let port = server.kill();
        // Down: a checkout tests a pooled connection (dead), tries to connect (refused) and
        // gives up at its timeout, with the reason.
        let p = pool.clone();
        let down = finish(sched.spawn(move || p.get_timeout(Duration::from_millis(200)).err()));
        let e = down.expect("no connection while the server is down");
        assert!(e.to_string().contains("timed out"), "{e}");
        let server = Server::start_on(port);
        assert_eq!(
            round("fibra:pool:after"),
            5000,
            "no checkout failed after the restart"
        );
        let mut con = redis::Client::open(server.url())
            .unwrap()
            .get_connection()
            .unwrap();
        let n: i64 = con.get("fibra:pool:after").unwrap();
        assert_eq!(n, 5000);
        // Killed mid-load, restarted 100 ms later: a command on a connection in use at the
        // kill fails (at most one per connection, 8), every checkout succeeds (a checkout
        // while the server is down retries its connect until it is back), nothing hangs.
        let (ok, failed) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
        let hs: Vec<_> = (0..1000)
            .map(|_| {
                let (pool, ok, failed) = (pool.clone(), ok.clone(), failed.clone());
                sched.spawn(move || {
                    for _ in 0..5 {
                        let mut con = pool.get().expect("a checkout, even across the restart");
                        match con.incr::<_, _, i64>("fibra:pool:during", 1) {
                            Ok(_) => ok.fetch_add(1, SeqCst),
                            Err(_) => failed.fetch_add(1, SeqCst),
                        };
                    }
                })
            })
            .collect();
        while ok.load(SeqCst) < 1000 {
            std::thread::sleep(Duration::from_millis(1));
        }
        let port = server.kill();
        std::thread::sleep(Duration::from_millis(100));
        let _server = Server::start_on(port);
        for h in hs {
            finish(h);
        }
        let (ok, failed) = (ok.load(SeqCst), failed.load(SeqCst));
        eprintln!("killed mid-load: {ok} increments landed, {failed} failed");
        assert_eq!(ok + failed, 5000);
        assert!(
            failed <= 8,
            "{failed} commands failed: more than one per connection"
        );
        let s = pool.state();
        assert!(s.connections <= 8, "{s:?}");
        assert_eq!(
            s.connections, s.idle_connections,
            "every connection came back"
        );
        sched.stop();
    });
}
