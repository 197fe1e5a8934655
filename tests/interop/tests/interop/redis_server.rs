//! The synchronous `redis` client, unmodified, in 1 000 fibers against a real
//! `redis-server`: with the `hook` feature its blocking socket calls park only their fiber.
//! Needs `redis-server` on the PATH; run with `cargo test -p fibra-interop --features redis-tests`.
#![cfg(feature = "redis-tests")]

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{finish, with_deadline};
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
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
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
        raise_fd_limit();
        let server = Server::start();
        let client = redis::Client::open(server.url()).unwrap();
        let sched = Arc::new(fibra::Scheduler::builder().threads(2).build().unwrap());
        sched.start();
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
