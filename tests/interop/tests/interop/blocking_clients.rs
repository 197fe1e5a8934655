//! Blocking HTTP clients, unmodified, in fibers: with the `hook` feature their socket waits
//! park only the fiber, so 300 requests overlap on two workers.
#![cfg(feature = "hook")]

use std::io::{Read, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::finish;
use crate::common::with_deadline;
use fibra::Scheduler;

fn sched(threads: usize) -> Arc<Scheduler> {
    let s = Arc::new(Scheduler::builder().threads(threads).build().unwrap());
    s.start();
    s
}

/// A loopback HTTP server on its own scheduler (fibra::net) that answers each request after
/// `delay`, keep-alive. Returns its address.
fn slow_http_server(delay: Duration) -> (std::net::SocketAddr, Arc<Scheduler>) {
    let server = sched(1);
    let listener = fibra::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    server
        .submit(
            move || loop {
                let Ok((mut c, _)) = listener.accept() else {
                    continue;
                };
                fibra::spawn(move || {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 1024];
                    loop {
                        while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            buf.drain(..end + 4);
                            fibra::sleep(delay);
                            let body = "slow hello";
                            let resp = format!(
                                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                                body.len()
                            );
                            if c.write_all(resp.as_bytes()).is_err() {
                                return;
                            }
                        }
                        match c.read(&mut chunk) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                });
            },
            None,
        )
        .unwrap();
    (addr, server)
}

#[test]
fn ureq_in_300_fibers_on_two_workers_overlaps_its_waits() {
    with_deadline(|| {
        const DELAY: Duration = Duration::from_millis(50);
        let (addr, server) = slow_http_server(DELAY);
        let s = sched(2);
        let url = format!("http://{addr}/hello");
        let start = Instant::now();
        let hs: Vec<_> = (0..300)
            .map(|_| {
                let url = url.clone();
                s.submit(
                    move || {
                        let mut resp = ureq::get(&url).call().unwrap();
                        resp.body_mut().read_to_string().unwrap()
                    },
                    None,
                )
                .unwrap()
            })
            .collect();
        for h in hs {
            assert_eq!(finish(h), "slow hello");
        }
        let took = start.elapsed();
        // One after another: 300 × 50 ms = 15 s (7.5 s on two blocked workers).
        assert!(
            took < DELAY * 40,
            "300 requests with a 50 ms answer took {took:?}"
        );
        s.stop();
        server.stop_timeout(Duration::from_millis(10));
    });
}
