//! The hooked C library functions themselves, one file a family of calls. Each is the real
//! call unless it runs in a fiber with hooks on (or on an fd fibra switched to non-blocking
//! mode, where a plain thread's call is made to block as the user expects). See the module
//! docs of `fibra::hook`. This file owns only the table that makes the linker keep them all.
//!
//! | file | calls |
//! | --- | --- |
//! | `read_write` (with `msghdr`) | `read` `readv` `recv` `recvfrom` `recvmsg` `write` `writev` `send` `sendto` `sendmsg` |
//! | `connect` | `connect` `accept` `accept4` |
//! | `poll` | `poll` `ppoll` `select` |
//! | `sleep` | `nanosleep` `clock_nanosleep` `usleep` `sleep` |
//! | `getaddrinfo` | `getaddrinfo` |
//! | `fd_table` | `close` `fcntl` `ioctl` `dup` `dup2` `dup3` `socket` `socketpair` `pipe` `pipe2` |
//! | `transfer` | `splice` `tee` `vmsplice` `sendfile` `sendfile64` |
//! | `mmsg` | `recvmmsg` `sendmmsg` |
//! | `aliases` | `fcntl64` `__fcntl` `__read_chk` `__recv_chk` `__recvfrom_chk` `__poll_chk` `__ppoll_chk` |

#![allow(clippy::missing_safety_doc)]

mod aliases;
mod connect;
mod fd_table;
mod getaddrinfo;
mod mmsg;
mod msghdr;
mod poll;
mod read_write;
mod sleep;
mod transfer;

use aliases::{__fcntl, __poll_chk, __ppoll_chk, __read_chk, __recv_chk, __recvfrom_chk, fcntl64};
use connect::{accept, accept4, connect};
use fd_table::{close, dup, dup2, dup3, fcntl, ioctl, pipe, pipe2, socket, socketpair};
use getaddrinfo::getaddrinfo;
use mmsg::{recvmmsg, sendmmsg};
use poll::{poll, ppoll, select};
use read_write::{read, readv, recv, recvfrom, recvmsg, send, sendmsg, sendto, write, writev};
use sleep::{clock_nanosleep, nanosleep, sleep, usleep};
use transfer::{sendfile, sendfile64, splice, tee, vmsplice};

/// Every hook, referenced so the linker keeps them (see `hook::link`): each family's file
/// may be an object of its own, which the linker pulls in only if something refers to it.
pub(super) struct Hooks(#[allow(dead_code)] [*const (); 45]);
// SAFETY: a table of function addresses, never dereferenced.
unsafe impl Sync for Hooks {}
pub(super) static HOOKS: Hooks = Hooks([
    read as *const (),
    readv as *const (),
    recv as *const (),
    recvfrom as *const (),
    recvmsg as *const (),
    write as *const (),
    writev as *const (),
    send as *const (),
    sendto as *const (),
    sendmsg as *const (),
    connect as *const (),
    accept as *const (),
    accept4 as *const (),
    poll as *const (),
    ppoll as *const (),
    select as *const (),
    sleep as *const (),
    usleep as *const (),
    nanosleep as *const (),
    clock_nanosleep as *const (),
    getaddrinfo as *const (),
    close as *const (),
    fcntl as *const (),
    ioctl as *const (),
    dup as *const (),
    dup2 as *const (),
    dup3 as *const (),
    socket as *const (),
    socketpair as *const (),
    pipe as *const (),
    pipe2 as *const (),
    fcntl64 as *const (),
    __fcntl as *const (),
    __read_chk as *const (),
    __recv_chk as *const (),
    __recvfrom_chk as *const (),
    __poll_chk as *const (),
    __ppoll_chk as *const (),
    splice as *const (),
    tee as *const (),
    vmsplice as *const (),
    sendfile as *const (),
    sendfile64 as *const (),
    recvmmsg as *const (),
    sendmmsg as *const (),
]);
