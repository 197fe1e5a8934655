//! [`Pool`]: a connection pool in r2d2's shape, whose waits park a fiber (and block a plain
//! thread) instead of blocking the worker.
//!
//! At most `max_size` connections exist. A checkout takes a permit of a [`Semaphore`] of
//! `max_size` permits, first come, first served, then an idle connection, or makes one if
//! none is idle (in the caller: a hooked `connect` parks only that fiber). The permit goes
//! with the [`PooledConnection`]; dropping that returns the connection to the idle list (or
//! drops it, if the manager says it broke) and then the permit, which the semaphore hands to
//! the first waiter. So no connection is lost, none is held by two users at once, and
//! connections plus permits in use never exceed `max_size`.

use super::{Mutex, Semaphore};
use std::collections::VecDeque;
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Makes and checks a pool's connections: r2d2's trait, with its very methods.
pub trait ManageConnection: Send + Sync + 'static {
    /// The connection type.
    type Connection: Send + 'static;
    /// The error `connect` and `is_valid` report.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Opens a new connection. Runs in the fiber (or thread) that checks one out.
    fn connect(&self) -> Result<Self::Connection, Self::Error>;

    /// Whether `conn` still works (a round trip to the server, typically): called on an
    /// idle connection before it is handed out, with
    /// [`test_on_check_out`](PoolBuilder::test_on_check_out).
    fn is_valid(&self, conn: &mut Self::Connection) -> Result<(), Self::Error>;

    /// A quick, local look at whether `conn` is broken, when it comes back: a broken one is
    /// dropped instead of kept, and a later checkout makes a new one.
    fn has_broken(&self, conn: &mut Self::Connection) -> bool;
}

/// Why a checkout (or `build`) gave no connection.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PoolError {
    /// No connection came within the connection timeout: all were in use, or making one
    /// failed (the last failure is in `last_error`).
    Timeout {
        /// The last `connect` (or `is_valid`) error before the timeout, if any.
        last_error: Option<String>,
    },
    /// `max_size(0)`, or a `min_idle` above `max_size`.
    InvalidConfig(&'static str),
}

impl fmt::Display for PoolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PoolError::Timeout { last_error: None } => {
                f.write_str("timed out waiting for a connection")
            }
            PoolError::Timeout {
                last_error: Some(e),
            } => write!(f, "timed out waiting for a connection: {e}"),
            PoolError::InvalidConfig(why) => write!(f, "invalid pool configuration: {why}"),
        }
    }
}

impl std::error::Error for PoolError {}

/// How many connections a pool has: [`Pool::state`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolState {
    /// Connections that exist, in use or idle.
    pub connections: u32,
    /// Connections idle in the pool.
    pub idle_connections: u32,
}

/// Configures a [`Pool`]; from [`Pool::builder`]. Defaults as r2d2's: `max_size` 10,
/// `min_idle` `None` (as many as `max_size`), `connection_timeout` 30 s,
/// `test_on_check_out` true.
#[derive(Debug, Clone)]
pub struct PoolBuilder<M> {
    max_size: u32,
    min_idle: Option<u32>,
    connection_timeout: Duration,
    test_on_check_out: bool,
    _manager: std::marker::PhantomData<fn() -> M>,
}

impl<M: ManageConnection> PoolBuilder<M> {
    /// The most connections the pool holds, in use and idle together. Default 10.
    pub fn max_size(mut self, max_size: u32) -> Self {
        self.max_size = max_size;
        self
    }

    /// How many connections [`build`](PoolBuilder::build) opens before it returns. Default
    /// `None`: `max_size`. (Unlike r2d2, no background thread tops the idle list up later:
    /// checkouts open connections as they need them.)
    pub fn min_idle(mut self, min_idle: Option<u32>) -> Self {
        self.min_idle = min_idle;
        self
    }

    /// How long a checkout ([`Pool::get`]) waits for a connection before it fails with
    /// [`PoolError::Timeout`], and how long `build` tries to open its first ones. Default
    /// 30 s.
    pub fn connection_timeout(mut self, timeout: Duration) -> Self {
        self.connection_timeout = timeout;
        self
    }

    /// Whether a checkout tests an idle connection with
    /// [`ManageConnection::is_valid`] before handing it out, dropping it and trying the next
    /// (or a new one) if it fails. Default true: after the server restarts, every old
    /// connection is found broken at its checkout, which gets a working one instead.
    pub fn test_on_check_out(mut self, test: bool) -> Self {
        self.test_on_check_out = test;
        self
    }

    /// Makes the pool and opens its first connections (`min_idle`, or `max_size`), retrying
    /// for up to the connection timeout. Runs `connect` in the caller.
    ///
    /// # Errors
    /// [`PoolError::InvalidConfig`] for `max_size(0)` or `min_idle` above `max_size`;
    /// [`PoolError::Timeout`] if the first connections could not be opened in time.
    pub fn build(self, manager: M) -> Result<Pool<M>, PoolError> {
        let first = self.min_idle.unwrap_or(self.max_size);
        let pool = self.checked(manager)?;
        let deadline = crate::sys::deadline_after(pool.0.timeout);
        let mut made = 0;
        while made < first {
            match pool.0.manager.connect() {
                Ok(c) => {
                    pool.0.state.lock().unwrap().push_idle(c, true);
                    made += 1;
                }
                Err(e) if !pause_before_retry(deadline) => {
                    return Err(PoolError::Timeout {
                        last_error: Some(e.to_string()),
                    });
                }
                Err(_) => {}
            }
        }
        Ok(pool)
    }

    /// Makes the pool without opening any connection: checkouts open them as needed.
    ///
    /// # Panics
    /// For `max_size(0)` or `min_idle` above `max_size`.
    pub fn build_unchecked(self, manager: M) -> Pool<M> {
        match self.checked(manager) {
            Ok(pool) => pool,
            Err(e) => panic!("{e}"),
        }
    }

    fn checked(self, manager: M) -> Result<Pool<M>, PoolError> {
        if self.max_size == 0 {
            return Err(PoolError::InvalidConfig("max_size must be at least 1"));
        }
        if self.min_idle.is_some_and(|m| m > self.max_size) {
            return Err(PoolError::InvalidConfig("min_idle is above max_size"));
        }
        Ok(Pool(Arc::new(Shared {
            manager,
            max_size: self.max_size,
            timeout: self.connection_timeout,
            test: self.test_on_check_out,
            permits: Semaphore::new(self.max_size as usize),
            state: Mutex::new(State {
                idle: VecDeque::new(),
                connections: 0,
            }),
        })))
    }
}

/// A pool of connections made by an `M:` [`ManageConnection`], shared by cloning (the clones
/// are one pool). Checkouts wait first come, first served, parking a fiber or blocking a
/// plain thread; see the module docs for what it guarantees.
///
/// ```
/// use fibra::sync::{ManageConnection, Pool};
/// use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
///
/// /// Connections that are numbers, counted as they are made.
/// struct Numbers(AtomicU32);
/// impl ManageConnection for Numbers {
///     type Connection = u32;
///     type Error = std::io::Error;
///     fn connect(&self) -> std::io::Result<u32> {
///         Ok(self.0.fetch_add(1, SeqCst))
///     }
///     fn is_valid(&self, _: &mut u32) -> std::io::Result<()> {
///         Ok(())
///     }
///     fn has_broken(&self, _: &mut u32) -> bool {
///         false
///     }
/// }
///
/// let sched = fibra::Scheduler::builder().threads(2).build()?;
/// sched.start();
/// let pool = Pool::builder().max_size(2).build(Numbers(AtomicU32::new(0))).unwrap();
/// let users: Vec<_> = (0..100)
///     .map(|_| {
///         let pool = pool.clone();
///         sched.spawn(move || {
///             let conn = pool.get().unwrap(); // parks the fiber while both are in use
///             fibra::sleep(std::time::Duration::from_micros(100));
///             *conn
///         })
///     })
///     .collect();
/// for u in users {
///     assert!(u.join().unwrap() < 2); // never a third connection
/// }
/// assert_eq!(pool.state().connections, 2);
/// sched.stop();
/// # Ok::<(), fibra::Error>(())
/// ```
pub struct Pool<M: ManageConnection>(Arc<Shared<M>>);

struct Shared<M: ManageConnection> {
    manager: M,
    max_size: u32,
    timeout: Duration,
    test: bool,
    /// One permit per connection a checkout may hold: FIFO, handed over on release.
    permits: Semaphore,
    state: Mutex<State<M::Connection>>,
}

struct State<C> {
    /// Idle connections, the most recently returned last.
    idle: VecDeque<C>,
    /// Connections that exist, idle or in use.
    connections: u32,
}

impl<C> State<C> {
    fn push_idle(&mut self, conn: C, new: bool) {
        self.idle.push_back(conn);
        if new {
            self.connections += 1;
        }
    }
}

impl<M: ManageConnection> Clone for Pool<M> {
    fn clone(&self) -> Self {
        Pool(self.0.clone())
    }
}

impl<M: ManageConnection> fmt::Debug for Pool<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool")
            .field("max_size", &self.0.max_size)
            .field("state", &self.state())
            .finish()
    }
}

impl<M: ManageConnection> Pool<M> {
    /// A builder with r2d2's defaults (see [`PoolBuilder`]).
    pub fn builder() -> PoolBuilder<M> {
        PoolBuilder {
            max_size: 10,
            min_idle: None,
            connection_timeout: Duration::from_secs(30),
            test_on_check_out: true,
            _manager: std::marker::PhantomData,
        }
    }

    /// A pool with the defaults, its first connections open: `Pool::builder().build(m)`.
    ///
    /// # Errors
    /// As [`PoolBuilder::build`].
    pub fn new(manager: M) -> Result<Pool<M>, PoolError> {
        Pool::builder().build(manager)
    }

    /// Checks a connection out, waiting up to the connection timeout.
    ///
    /// # Errors
    /// [`PoolError::Timeout`] if none came in time.
    pub fn get(&self) -> Result<PooledConnection<M>, PoolError> {
        self.get_timeout(self.0.timeout)
    }

    /// Checks a connection out, waiting up to `timeout`: first for a permit (first come,
    /// first served), then, if no idle connection is left (or the idle ones fail
    /// `is_valid`), for `connect`, retried until the timeout.
    ///
    /// # Errors
    /// [`PoolError::Timeout`], with the last connection error if there was one.
    pub fn get_timeout(&self, timeout: Duration) -> Result<PooledConnection<M>, PoolError> {
        let deadline = crate::sys::deadline_after(timeout);
        let Some(permit) = self.0.permits.acquire_timeout(timeout) else {
            return Err(PoolError::Timeout { last_error: None });
        };
        // From here the permit belongs to the checkout: given back by the connection's
        // drop, or below if none comes.
        permit.forget();
        match self.connection_for_permit(deadline) {
            Ok(conn) => Ok(PooledConnection {
                pool: self.clone(),
                conn: Some(conn),
            }),
            Err(e) => {
                self.0.permits.release(1);
                Err(e)
            }
        }
    }

    /// Checks an idle connection out if one is idle now and a permit is free: no waiting,
    /// no connecting (as r2d2's).
    pub fn try_get(&self) -> Option<PooledConnection<M>> {
        let permit = self.0.permits.try_acquire()?;
        let conn = loop {
            let conn = self.0.state.lock().unwrap().idle.pop_back()?;
            match self.checked_out(conn) {
                Ok(conn) => break conn,
                Err(_) => continue,
            }
        };
        permit.forget();
        Some(PooledConnection {
            pool: self.clone(),
            conn: Some(conn),
        })
    }

    /// How many connections exist, and how many are idle.
    pub fn state(&self) -> PoolState {
        let s = self.0.state.lock().unwrap();
        PoolState {
            connections: s.connections,
            idle_connections: s.idle.len() as u32,
        }
    }

    /// The most connections the pool holds.
    pub fn max_size(&self) -> u32 {
        self.0.max_size
    }

    /// With a permit held: an idle connection that passes the check-out test, or a new one,
    /// trying until `deadline`.
    fn connection_for_permit(&self, deadline: Instant) -> Result<M::Connection, PoolError> {
        loop {
            let idle = self.0.state.lock().unwrap().idle.pop_back();
            if let Some(conn) = idle {
                // One that fails the test is dropped: the next idle one, or a new one.
                match self.checked_out(conn) {
                    Ok(conn) => return Ok(conn),
                    Err(_) => continue,
                }
            }
            // No idle connection: this permit's connection is to be made. Counted first,
            // so that `state` never shows more than `max_size`.
            self.0.state.lock().unwrap().connections += 1;
            match self.0.manager.connect() {
                Ok(conn) => return Ok(conn),
                Err(e) => {
                    self.0.state.lock().unwrap().connections -= 1;
                    if !pause_before_retry(deadline) {
                        return Err(PoolError::Timeout {
                            last_error: Some(e.to_string()),
                        });
                    }
                }
            }
        }
    }

    /// `conn`, taken from the idle list, if it passes the check-out test; dropped (and
    /// uncounted) if not.
    fn checked_out(&self, mut conn: M::Connection) -> Result<M::Connection, M::Error> {
        if !self.0.test {
            return Ok(conn);
        }
        match self.0.manager.is_valid(&mut conn) {
            Ok(()) => Ok(conn),
            Err(e) => {
                drop(conn);
                self.0.state.lock().unwrap().connections -= 1;
                Err(e)
            }
        }
    }
}

/// Sleeps a little before another `connect` (the fiber only, in a fiber), unless that
/// would pass `deadline`; whether there is time for another try.
fn pause_before_retry(deadline: Instant) -> bool {
    let now = Instant::now();
    if now >= deadline {
        return false;
    }
    crate::time::sleep((deadline - now).min(Duration::from_millis(20)));
    Instant::now() < deadline
}

/// A connection checked out of a [`Pool`]: derefs to the connection; dropping it returns
/// the connection to the pool, or drops it if [`ManageConnection::has_broken`] says so.
pub struct PooledConnection<M: ManageConnection> {
    pool: Pool<M>,
    conn: Option<M::Connection>,
}

impl<M: ManageConnection> Deref for PooledConnection<M> {
    type Target = M::Connection;
    fn deref(&self) -> &M::Connection {
        self.conn.as_ref().expect("present until dropped")
    }
}

impl<M: ManageConnection> DerefMut for PooledConnection<M> {
    fn deref_mut(&mut self) -> &mut M::Connection {
        self.conn.as_mut().expect("present until dropped")
    }
}

impl<M: ManageConnection> fmt::Debug for PooledConnection<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PooledConnection")
            .field("pool", &self.pool)
            .finish_non_exhaustive()
    }
}

impl<M: ManageConnection> Drop for PooledConnection<M> {
    fn drop(&mut self) {
        let shared = &self.pool.0;
        if let Some(mut conn) = self.conn.take() {
            // The permit is given back even if `has_broken` or a connection's drop panics.
            struct Release<'a>(&'a Semaphore);
            impl Drop for Release<'_> {
                fn drop(&mut self) {
                    self.0.release(1);
                }
            }
            let _release = Release(&shared.permits);
            // A `has_broken` that panics counts as broken: the connection is dropped and
            // uncounted, and the panic goes on.
            let broken = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                shared.manager.has_broken(&mut conn)
            }));
            if broken.as_ref().is_ok_and(|b| !b) {
                shared.state.lock().unwrap().push_idle(conn, false);
            } else {
                shared.state.lock().unwrap().connections -= 1;
                drop(conn);
            }
            if let Err(panic) = broken {
                std::panic::resume_unwind(panic);
            }
        }
    }
}
