//! Fiber-aware sockets with std's API: [`TcpListener`], [`TcpStream`], [`UdpSocket`] and, in
//! [`unix`], Unix-domain sockets; [`TcpSocket`] sets TCP options before listening or
//! connecting.
//!
//! Every call tries the system call first and waits only on `EAGAIN`: inside a fiber the fiber
//! parks until the reactor reports readiness; on a plain thread the thread blocks in
//! `poll(2)`, so these types behave exactly like std's there. Sockets are kept in
//! non-blocking mode and registered with the reactor the first time they have to wait.
//! Timeouts (`set_read_timeout`, `connect_timeout`) end a wait with
//! [`io::ErrorKind::WouldBlock`](std::io::ErrorKind::WouldBlock), as std reports them on Linux.
//!
//! Addresses are given as [`ToSocketAddrs`], fibra's sealed counterpart of std's trait for the
//! same types: literal addresses are parsed in place, host names are resolved on the blocking
//! pool ([`unblock`](crate::unblock())) so that a slow lookup parks only the calling fiber.
//! No write raises `SIGPIPE`: a vanished peer is an `EPIPE` error from every write call.
//!
//! ```
//! use std::io::{Read, Write};
//! use fibra::net::{TcpListener, TcpStream};
//!
//! let sched = fibra::Scheduler::builder().threads(2).build().unwrap();
//! sched.start();
//! let listener = TcpListener::bind("127.0.0.1:0").unwrap();
//! let addr = listener.local_addr().unwrap();
//! let server = sched.submit(move || {
//!     let (mut conn, _) = listener.accept().unwrap();
//!     let mut buf = [0u8; 4];
//!     conn.read_exact(&mut buf).unwrap();
//!     conn.write_all(&buf).unwrap();
//! }, None).unwrap();
//! let client = sched.submit(move || {
//!     let mut s = TcpStream::connect(addr).unwrap();
//!     s.write_all(b"ping").unwrap();
//!     let mut buf = [0u8; 4];
//!     s.read_exact(&mut buf).unwrap();
//!     buf
//! }, None).unwrap();
//! assert_eq!(&client.join().unwrap(), b"ping");
//! server.join().unwrap();
//! ```
//!
//! A server can also wait for a request without a fiber: [`TcpStream::try_read`] until
//! `WouldBlock`, then [`TcpStream::spawn_when_readable`] hands the socket to a new task once
//! data comes, on whichever worker is free. [`TcpStream::serve`] and
//! [`TcpListener::serve`] make a server of that, the way to write a latency-critical one
//! (see `examples/http_cont.rs`). By hand:
//!
//! ```
//! use std::io::{ErrorKind, Read, Write};
//! use fibra::net::{TcpListener, TcpStream};
//!
//! /// Echoes what `s` has, then waits for more with no fiber and no stack held.
//! fn echo(s: TcpStream) {
//!     let mut buf = [0u8; 64];
//!     loop {
//!         match s.try_read(&mut buf) {
//!             Ok(0) => return, // the peer closed
//!             Ok(n) => (&s).write_all(&buf[..n]).unwrap(),
//!             Err(e) if e.kind() == ErrorKind::WouldBlock => {
//!                 s.spawn_when_readable(echo).unwrap();
//!                 return;
//!             }
//!             Err(e) => panic!("{e}"),
//!         }
//!     }
//! }
//!
//! let sched = fibra::Scheduler::builder().threads(2).build().unwrap();
//! sched.start();
//! let listener = TcpListener::bind("127.0.0.1:0").unwrap();
//! let addr = listener.local_addr().unwrap();
//! sched.spawn(move || echo(listener.accept().unwrap().0));
//! let reply = sched.block_on(move || {
//!     let mut s = TcpStream::connect(addr).unwrap();
//!     s.write_all(b"ping").unwrap();
//!     let mut buf = [0u8; 4];
//!     s.read_exact(&mut buf).unwrap();
//!     buf
//! });
//! assert_eq!(&reply, b"ping");
//! sched.stop(); // the connection is closed at the end of `block_on`: the chain ends
//! ```

mod addr;
#[macro_use]
mod registration;
mod send;
pub(crate) mod serve;
mod socket;
mod tcp;
mod udp;
pub mod unix;

pub use addr::ToSocketAddrs;
pub use serve::Serve;
pub use socket::TcpSocket;
pub use tcp::{Incoming, TcpListener, TcpStream};
pub use udp::UdpSocket;
