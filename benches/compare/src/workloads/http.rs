//! http: the server side of the HTTP benchmark. Each peer serves a fixed "Hello, world!" over
//! HTTP/1.1 keep-alive with one task per connection; the parent process (see `crate::driver`)
//! runs `wrk -t1 -c100 -d5s` against it and reads requests/s.
//!
//! tokio and may use the same minimal request framing ([`split_requests`]): a request ends at
//! the blank line (wrk's GETs carry no body) and pipelined requests are answered in order.
//! Go uses `net/http` (see `go/http.go`). fibra's server is `examples/http_hello` (parsed with
//! httparse), which `crate::driver` builds and starts itself.
//!
//! `http_cont` runs the same load against `examples/http_cont`, fibra's server written with
//! readiness continuations (a request is a new task on any worker, not the wake of a fiber
//! parked on its connection's worker), and against tokio's and Go's servers.
//!
//! `http_hooked` runs the same load against `examples/http_std` (peer `fibra`: the same server
//! written with `std::net` and run with fibra's `hook` feature), `examples/http_hello` (peer
//! `fibra-net`) and tokio's server here, so fibra/fibra-net is the cost of the hooks.

use std::io::{Read, Write};

use super::Peer;
use crate::rt;

/// The full response to one request.
pub const RESPONSE: &[u8] =
    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 13\r\n\r\nHello, world!";

/// Largest request head a connection buffers before giving up on it.
const BUF: usize = 8 * 1024;

/// Counts the complete requests at the start of `buf`; returns (requests, bytes they span).
pub fn split_requests(buf: &[u8]) -> (usize, usize) {
    let (mut count, mut used) = (0, 0);
    while let Some(end) = buf[used..].windows(4).position(|w| w == b"\r\n\r\n") {
        count += 1;
        used += end + 4;
    }
    (count, used)
}

/// Consumes the complete requests in `buf[..*filled]`, shifting any partial one to the front,
/// and returns the bytes to write back (one response per request).
fn answer(buf: &mut [u8], filled: &mut usize, out: &mut Vec<u8>) {
    let (count, used) = split_requests(&buf[..*filled]);
    buf.copy_within(used..*filled, 0);
    *filled -= used;
    out.clear();
    for _ in 0..count {
        out.extend_from_slice(RESPONSE);
    }
}

/// Runs `peer`'s server on 127.0.0.1:`port` until the process is killed.
pub fn serve(peer: Peer, port: u16, threads: usize) -> Result<(), String> {
    match peer {
        Peer::Tokio => {
            serve_tokio(port, threads);
            Ok(())
        }
        Peer::May => serve_may(port, threads),
        other => Err(format!(
            "no in-process http server for {} (fibra runs its examples, Go its own binary)",
            other.name()
        )),
    }
}

fn serve_tokio(port: u16, threads: usize) {
    async fn connection(mut sock: tokio::net::TcpStream) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut buf, mut filled, mut out) = (vec![0u8; BUF], 0, Vec::new());
        loop {
            match sock.read(&mut buf[filled..]).await {
                Ok(0) | Err(_) => return,
                Ok(n) => filled += n,
            }
            answer(&mut buf, &mut filled, &mut out);
            if filled == BUF || sock.write_all(&out).await.is_err() {
                return;
            }
        }
    }
    let rt = rt::tokio(threads);
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .expect("bind");
        loop {
            if let Ok((sock, _)) = listener.accept().await {
                let _ = sock.set_nodelay(true);
                tokio::spawn(connection(sock));
            }
        }
    });
}

fn serve_may(port: u16, threads: usize) -> Result<(), String> {
    fn connection(mut sock: may::net::TcpStream) {
        let (mut buf, mut filled, mut out) = (vec![0u8; BUF], 0, Vec::new());
        loop {
            match sock.read(&mut buf[filled..]) {
                Ok(0) | Err(_) => return,
                Ok(n) => filled += n,
            }
            answer(&mut buf, &mut filled, &mut out);
            if filled == BUF || sock.write_all(&out).is_err() {
                return;
            }
        }
    }
    rt::may(threads);
    let listener = may::net::TcpListener::bind(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    let acceptor = rt::may_go(move || {
        for sock in listener.incoming().flatten() {
            let _ = sock.set_nodelay(true);
            rt::may_go(move || connection(sock));
        }
    });
    acceptor
        .join()
        .map_err(|_| "may acceptor panicked".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_pipelined_requests_and_keeps_partial_tail() {
        let req = b"GET / HTTP/1.1\r\nHost: x\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\nGET /";
        let (count, used) = split_requests(req);
        assert_eq!(count, 2);
        assert_eq!(&req[used..], b"GET /");

        let mut buf = req.to_vec();
        let mut filled = buf.len();
        let mut out = Vec::new();
        answer(&mut buf, &mut filled, &mut out);
        assert_eq!(out.len(), 2 * RESPONSE.len());
        assert_eq!(&buf[..filled], b"GET /");
    }
}
