//! `fibra::net` on 127.0.0.1: TCP, UDP and Unix sockets from fibers and threads, socket
//! options, readiness continuations, name resolution, `SIGPIPE`, the poller role, and
//! thousands of idle connections.

#[path = "../common/mod.rs"]
mod common;

mod continuations;
mod edge_cases;
mod home;
mod idle_connections;
mod poller;
mod resolve;
mod serve;
mod sigpipe;
mod tcp_socket;
mod tcp_udp;
mod unix;
mod util;
