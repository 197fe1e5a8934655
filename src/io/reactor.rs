//! The reactor: the process's shared epoll instance (edge-triggered), the readiness record
//! of every registered file descriptor, and the poller role.
//!
//! There is no poller thread. A fiber's fd that nobody else waits for moves into its
//! worker's own epoll instance (`super::home`), where that worker sees its readiness itself,
//! sleeping in `epoll_wait` there when it has nothing to run. Every other fd — one waited for
//! from several workers, by a readiness continuation, by a plain thread — is in the shared
//! instance, polled Go's way: a worker with nothing to run becomes *the* poller if nobody
//! else is and somebody waits there. It blocks in `epoll_pwait2` (`epoll_wait` on kernels
//! before 5.11) with its next timer deadline as timeout, in the shared instance (or at home
//! with the shared one nested, if it must watch both), while other idle workers sleep on
//! their futex or at home. Anyone who needs a sleeping worker back (new work, a wake of one of
//! its fibers) writes to the eventfd of the instance it sleeps in. Busy workers take a
//! non-blocking look every few dozen tasks, so readiness is never stuck behind a long run of
//! work. The reactor is shared by every scheduler of the process: an idle worker that finds
//! the role taken, or not needed, sleeps on the standby list, and when the role is released,
//! a worker thread leaves its loop, or the shared instance gets its first waiter while nobody
//! polls, one of those is woken to take it ([`Reactor::hand_off`]).
//!
//! A waiter is a parked fiber (its `Unparker`) or a readiness continuation
//! ([`Continuation`]): work that the poller submits as a new task when the readiness comes.
//!
//! Readiness is edge-triggered and remembered per record: the poller sets bits and bumps a
//! tick; an I/O call that gets `EAGAIN` clears its bit only if the tick is still the one it
//! saw before the syscall, then waits for the bit. A readiness edge between the syscall and the
//! wait is therefore never lost.

use super::home::{epoll_wait_on, Waiters};
use super::poll::timed_out;
pub(crate) use super::poll::{poll_fd, poll_once};
use crate::park::WaitOn;
use crate::park::{park_until, ParkResult, Unparker};
use crate::sched::worker::Shared;
use crate::sys::spin::SpinLock;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

/// Readiness bits.
pub(crate) const READABLE: u32 = 1;
pub(crate) const WRITABLE: u32 = 2;
/// The peer hung up or the socket failed: wakes waiters of either direction.
pub(crate) const CLOSED: u32 = 4;
/// The receive side is shut down (`EPOLLRDHUP`), for good: kept when readiness is cleared.
/// It comes with `READABLE`. A stream's reads then return end-of-file; a datagram socket's
/// non-blocking ones still fail with `EAGAIN` where a blocking one returns 0, which the
/// `hook` feature's blocking emulation needs to know.
pub(crate) const READ_SHUT: u32 = 8;
/// The record was deregistered: its fd was closed or its number given to another file (by
/// the owner, or behind its back through the `hook` feature's `close` and `dup2`), so a
/// system call on the fd number may reach another file. Comes with `CLOSED`; kept for good.
pub(crate) const GONE: u32 = 16;

/// The event `data` of an epoll instance's own eventfd.
pub(super) const WAKE_TOKEN: u64 = u64::MAX;
/// How many events one `epoll_wait` takes.
pub(super) const EVENTS: usize = 256;

/// A registered file descriptor: its readiness, and the fibers and continuations waiting for
/// it.
pub(crate) struct IoRecord {
    fd: RawFd,
    generation: u32,
    /// `(tick << 32) | bits`.
    readiness: AtomicU64,
    /// The waiters, and which epoll instance the fd is in (see `super::home`).
    waiters: SpinLock<Waiters>,
    next_waiter: AtomicU64,
}

pub(super) struct Waiter {
    pub(super) id: u64,
    interest: u32,
    wake: Wake,
}

/// What a waiter's readiness sets going.
enum Wake {
    /// A parked fiber, unparked.
    Fiber(Unparker),
    /// A readiness continuation, submitted as a new task (see [`Continuation`]).
    Task(Continuation),
}

/// Work to submit as a new task of `shared`'s scheduler once a descriptor is ready: what
/// `spawn_when_readable` registers instead of parking a fiber, so that between two
/// readinesses a connection holds no stack and, when it is ready, any worker may run it.
///
/// It holds one unit of the scheduler's `live` count from registration until it is
/// submitted (the task inherits the unit) or cancelled, so `stop` waits for it as for a
/// parked fiber and `stop_timeout` cancels it. While registered it also counts as an I/O
/// waiter, which keeps some worker polling the reactor.
pub(crate) struct Continuation {
    pub(crate) shared: Arc<Shared>,
    pub(crate) run: Box<dyn FnOnce() + Send>,
    pub(crate) location: &'static std::panic::Location<'static>,
}

impl Continuation {
    /// Taken off a record's waiter list: no longer counted among the I/O waiters.
    fn unlisted(self) -> Continuation {
        reactor().waiting.fetch_sub(1, Ordering::SeqCst);
        self
    }

    /// Queues the work as a task that inherits this continuation's `live` unit.
    fn submit(self) {
        self.shared.continuations.fetch_sub(1, Ordering::SeqCst);
        crate::sched::submit_admitted(&self.shared, self.run, self.location);
    }

    /// Drops the work unrun (a shutdown cancelled it) and gives back its `live` unit. A
    /// panic from dropping it (the closure's captures) is reported and contained: this runs
    /// in whichever thread drives the shutdown.
    fn cancel(self) {
        let Continuation { shared, run, .. } = self;
        shared.continuations.fetch_sub(1, Ordering::SeqCst);
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(run))).is_err() {
            eprintln!("fibra: dropping a cancelled readiness continuation panicked; ignored");
        }
        shared.task_done(shared.local_worker().map(|w| w.index));
    }
}

impl IoRecord {
    pub(super) fn fd(&self) -> RawFd {
        self.fd
    }

    /// The event `data` of the fd's registration: its generation and fd number.
    pub(super) fn token(&self) -> u64 {
        (u64::from(self.generation) << 32) | self.fd as u64
    }

    /// The readiness word before an I/O attempt, for [`IoRecord::clear`].
    pub(crate) fn snapshot(&self) -> u64 {
        self.readiness.load(Ordering::Acquire)
    }

    /// After `EAGAIN`: forget `interest` readiness, unless an event arrived since `seen`.
    /// `CLOSED` goes too: `EAGAIN` shows the error it stood for is gone (a UDP socket's ICMP
    /// error, once taken), and a kept `CLOSED` would make every later wait return at once.
    pub(crate) fn clear(&self, seen: u64, interest: u32) {
        let _ = self.readiness.compare_exchange(
            seen,
            seen & !u64::from(interest | CLOSED),
            Ordering::AcqRel,
            Ordering::Relaxed,
        );
    }

    fn ready(&self, interest: u32) -> bool {
        self.readiness.load(Ordering::Acquire) as u32 & (interest | CLOSED | GONE) != 0
    }

    /// The poller's half: record `bits`, wake the waiters they concern.
    fn set_ready(&self, bits: u32) {
        let _ = self
            .readiness
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |w| {
                let tick = (w >> 32).wrapping_add(1);
                Some((tick << 32) | u64::from(w as u32 | bits))
            });
        let woken = self
            .waiters
            .lock()
            .take(|w| w.interest & bits != 0 || bits & CLOSED != 0);
        for w in woken {
            match w.wake {
                Wake::Fiber(u) => u.unpark_owned(),
                Wake::Task(c) => c.unlisted().submit(),
            }
        }
    }

    /// Registers `c` to be submitted once `interest` (or a hang-up) is ready; submits it at
    /// once if it is ready now. The caller has counted it in its scheduler's `live`.
    pub(crate) fn on_ready(&self, interest: u32, c: Continuation) {
        let mut waiters = self.waiters.lock();
        if self.ready(interest) {
            drop(waiters);
            c.submit();
            return;
        }
        // A shutdown enters `Cancelling` before it sweeps the records for continuations
        // (`Reactor::cancel_continuations`), and sweeps each under its lock: under this
        // record's lock, either that sweep is still to come and will find the continuation,
        // or it has passed here and the phase says so.
        if c.shared.phase.get() >= crate::sched::worker::Phase::Cancelling {
            drop(waiters);
            c.cancel();
            return;
        }
        // Counted while listed (`Continuation::unlisted` takes it back).
        reactor().waiting.fetch_add(1, Ordering::SeqCst);
        // Unique among this record's waiters, as a fiber that times out removes its own by id.
        let id = self.next_waiter.fetch_add(1, Ordering::Relaxed);
        // Any worker may run it: the fd's readiness must not wait for one worker's thread.
        let moved = waiters.settle(self, None);
        let first = waiters.push(Waiter {
            id,
            interest,
            wake: Wake::Task(c),
        });
        drop(waiters);
        if moved || first {
            reactor().hand_off();
        }
    }

    /// Removes the continuations of the scheduler behind `shared`.
    fn take_continuations_of(&self, shared: &Shared, into: &mut Vec<Continuation>) {
        let mut waiters = self.waiters.lock();
        let ours =
            |w: &mut Waiter| matches!(&w.wake, Wake::Task(c) if std::ptr::eq(&*c.shared, shared));
        into.extend(waiters.take(ours).into_iter().filter_map(|w| match w.wake {
            Wake::Task(c) => Some(c.unlisted()),
            Wake::Fiber(_) => None,
        }));
    }

    /// Waits until `interest` (or a hang-up) is ready, or until `deadline`. In a scheduled
    /// fiber it parks the fiber; elsewhere it blocks the thread in `poll(2)`.
    pub(crate) fn wait(&self, interest: u32, deadline: Option<Instant>) -> io::Result<()> {
        let scheduled = crate::fiber::in_scheduled_fiber();
        if !scheduled {
            let bits = poll_fd(self.fd, interest, deadline)?;
            // Kept for the retry loops (`READ_SHUT`), which may have no poller to tell them.
            if bits & READ_SHUT != 0 {
                self.readiness
                    .fetch_or(u64::from(READ_SHUT), Ordering::AcqRel);
            }
            return Ok(());
        }
        let reactor = reactor();
        loop {
            if self.ready(interest) {
                return Ok(());
            }
            let id = self.next_waiter.fetch_add(1, Ordering::Relaxed);
            // Counted while parked, also if the fiber is cancelled and unwinds from the park.
            let _counted = WaitingGuard::new(&reactor.waiting);
            let on = WaitOn::Io {
                fd: self.fd,
                readable: interest & READABLE != 0,
                writable: interest & WRITABLE != 0,
            };
            let r = park_until(deadline, on, |u| {
                let mut waiters = self.waiters.lock();
                if self.ready(interest) {
                    drop(waiters);
                    u.unpark_owned();
                } else {
                    // The park's publication runs on the fiber's worker: the fd may move
                    // into that worker's own instance (see `super::home`).
                    let moved =
                        crate::sched::worker::with_current_home(|home| waiters.settle(self, home));
                    let first = waiters.push(Waiter {
                        id,
                        interest,
                        wake: Wake::Fiber(u),
                    });
                    drop(waiters);
                    if moved || first {
                        reactor.hand_off();
                    }
                }
            });
            if r == ParkResult::TimedOut {
                self.waiters.lock().remove(id);
                // The poller reports an fd registered (or made ready) just now only at its
                // next look, which a short deadline may not wait for: the fd itself says.
                if self.ready(interest) || poll_once(self.fd, interest, 0).is_ok_and(|b| b != 0) {
                    return Ok(());
                }
                return Err(timed_out());
            }
        }
    }

    /// Wakes every waiter with a hang-up, for good: the fd is going away.
    fn close(&self) {
        self.set_ready(CLOSED | GONE);
    }

    /// Marks `bits` ready and wakes their waiters, as if the poller had seen them: after a
    /// local `shutdown`, which the kernel may not report as an event, so waiters retry their
    /// call and see its end-of-file or error.
    pub(crate) fn wake(&self, bits: u32) {
        self.set_ready(bits);
    }
}

/// Counts a fiber as waiting for I/O for as long as it lives.
struct WaitingGuard<'a>(&'a AtomicUsize);

impl<'a> WaitingGuard<'a> {
    fn new(counter: &'a AtomicUsize) -> Self {
        counter.fetch_add(1, Ordering::SeqCst);
        WaitingGuard(counter)
    }
}

impl Drop for WaitingGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Parks the running scheduled fiber until one of `records` is ready for its interest (or
/// hung up), or until `deadline`; returns whether one is. The `poll` hook's wait.
#[cfg(feature = "hook")]
pub(crate) fn wait_any(records: &[(Arc<IoRecord>, u32)], deadline: Option<Instant>) -> bool {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let ready = || records.iter().any(|(r, i)| r.ready(*i));
    if ready() {
        return true;
    }
    // One id for all the records; per-record ids could collide with it, so it comes from
    // the top half of the id space, which per-record counters never reach.
    let id = (1 << 63) | NEXT.fetch_add(1, Ordering::Relaxed);
    let _counted = WaitingGuard::new(&reactor().waiting);
    let on = match records {
        // A poll of one fd waits for that fd, as the dump says.
        [(rec, interest)] => WaitOn::Io {
            fd: rec.fd,
            readable: interest & READABLE != 0,
            writable: interest & WRITABLE != 0,
        },
        _ => WaitOn::Other("poll (several fds)"),
    };
    let r = park_until(deadline, on, |u| {
        for (rec, interest) in records {
            let mut waiters = rec.waiters.lock();
            if rec.ready(*interest) {
                drop(waiters);
                u.unpark_owned();
                return;
            }
            // The shared instance: one wake for several fds, whichever worker sees it.
            let moved = waiters.settle(rec, None);
            let first = waiters.push(Waiter {
                id,
                interest: *interest,
                wake: Wake::Fiber(u.clone()),
            });
            drop(waiters);
            if moved || first {
                reactor().hand_off();
            }
        }
    });
    for (rec, _) in records {
        rec.waiters.lock().remove(id);
    }
    r != ParkResult::TimedOut || ready()
}

/// The process's epoll instance and record table.
pub(crate) struct Reactor {
    epoll: OwnedFd,
    wake: OwnedFd,
    /// Records by fd number.
    records: SpinLock<Vec<Option<Arc<IoRecord>>>>,
    generation: AtomicU64,
    /// A worker is blocked in `epoll_wait`.
    polling: AtomicBool,
    /// Fibers parked on I/O and registered continuations (for the metrics).
    waiting: AtomicUsize,
    /// Waiters on the fds in the shared instance (see `super::home`): while non-zero, some
    /// worker must poll it, and busy workers take a look now and then.
    pub(super) shared_waiting: AtomicUsize,
    /// Registered fds (changed under the `records` write lock).
    registered: AtomicUsize,
    /// Idle workers asleep on their own futex because another worker held the poller role,
    /// as (scheduler, worker index): when a worker thread stops driving its loop (its
    /// scheduler stopped, say) while I/O waiters remain and nobody polls, one of them is
    /// woken to take the role (`hand_off`). Without it the waiters of another scheduler would
    /// wait until one of its workers happened to wake.
    standby: SpinLock<Vec<(Weak<Shared>, usize)>>,
}

/// A worker's place on the reactor's standby list, left when dropped.
pub(crate) struct Standby<'a> {
    reactor: &'a Reactor,
    shared: *const Shared,
    index: usize,
}

impl Drop for Standby<'_> {
    fn drop(&mut self) {
        let mut list = self.reactor.standby.lock();
        if let Some(i) = list
            .iter()
            .position(|(s, i)| s.as_ptr() == self.shared && *i == self.index)
        {
            list.swap_remove(i);
        }
    }
}

/// Registered fds and fibers waiting for I/O, process-wide (for `Scheduler::metrics`).
pub(crate) fn counts() -> (usize, usize) {
    get().map_or((0, 0), |r| {
        (
            r.registered.load(Ordering::Relaxed),
            r.waiting.load(Ordering::Relaxed),
        )
    })
}

static REACTOR: OnceLock<Reactor> = OnceLock::new();

/// What every registration asks for: both directions, edge-triggered.
pub(super) const REGISTERED_EVENTS: u32 =
    (libc::EPOLLIN | libc::EPOLLPRI | libc::EPOLLOUT | libc::EPOLLRDHUP | libc::EPOLLET) as u32;

/// Held while the reactor is created, and by a `fork` from its `prepare` handler to its
/// `parent` or `child` one (see `fork_hold`): a reactor is never made during a fork, so the
/// child handler makes the child's own every reactor the parent had.
static CREATING: SpinLock<()> = SpinLock::new(());

/// The reactor's `fork` handlers, first of the subsystems' (`crate::fork::Slot::Reactor`).
static FORK: crate::fork::Handlers = crate::fork::Handlers {
    prepare: fork_hold,
    release: fork_release,
};

/// Whether `fork_hold` took the reactor's locks (changed only under `CREATING`).
static FORK_HELD: AtomicBool = AtomicBool::new(false);

/// Takes the reactor's locks before a `fork` (see `crate::fork`): the creation lock, then,
/// if there is a reactor, the registrations', each registration's waiters, and the standby
/// list.
fn fork_hold() {
    CREATING.fork_hold();
    let Some(r) = REACTOR.get() else { return };
    r.records.fork_hold();
    // SAFETY: this thread holds the lock just taken.
    let records = unsafe { r.records.fork_held() };
    for record in records.iter().flatten() {
        record.waiters.fork_hold();
    }
    r.standby.fork_hold();
    FORK_HELD.store(true, Ordering::Relaxed);
}

/// Releases what [`fork_hold`] took. In the child, first makes the reactor the child's own
/// (see `Reactor::after_fork_in_child`).
fn fork_release(in_child: bool) {
    if FORK_HELD.swap(false, Ordering::Relaxed) {
        let r = REACTOR.get().expect("held, so made before the fork");
        // SAFETY: `fork_hold` took these locks on this thread; nothing released them since,
        // and no registration changed, so these are the records whose waiters it locked.
        unsafe {
            let records = r.records.fork_held();
            if in_child {
                r.after_fork_in_child(records, r.standby.fork_held());
            }
            r.standby.fork_release();
            for record in records.iter().flatten() {
                record.waiters.fork_release();
            }
            r.records.fork_release();
        }
    }
    // SAFETY: `fork_hold` took it on this thread; nothing released it since.
    unsafe { CREATING.fork_release() };
}

/// The reactor, if any fd was ever registered (workers skip polling otherwise).
pub(crate) fn get() -> Option<&'static Reactor> {
    REACTOR.get()
}

/// The reactor, once a registration created it ([`registering`]); every use but a
/// registration comes after one.
///
/// # Panics
/// If no registration ever succeeded and the kernel refuses the epoll instance or eventfd
/// now; registrations go through [`registering`], which reports that as an error.
pub(crate) fn reactor() -> &'static Reactor {
    match REACTOR.get() {
        Some(r) => r,
        None => registering().expect("fibra: cannot create the epoll reactor"),
    }
}

/// The reactor for a registration, created on first use. Out of descriptors at the very
/// first registration (EMFILE, ENFILE), the registration fails with that error like any
/// other socket call, and a later one tries again.
pub(crate) fn registering() -> io::Result<&'static Reactor> {
    if let Some(r) = REACTOR.get() {
        return Ok(r);
    }
    // Before the lock (see `crate::fork::register`).
    crate::fork::register(crate::fork::Slot::Reactor, &FORK);
    let _creating = CREATING.lock();
    if let Some(r) = REACTOR.get() {
        return Ok(r);
    }
    let created = Reactor::new()?;
    Ok(REACTOR.get_or_init(|| created))
}

impl Reactor {
    fn new() -> io::Result<Reactor> {
        let (epoll, wake) = super::home::epoll_with_eventfd()?;
        Ok(Reactor {
            epoll,
            wake,
            records: SpinLock::new(Vec::new()),
            generation: AtomicU64::new(1),
            polling: AtomicBool::new(false),
            waiting: AtomicUsize::new(0),
            shared_waiting: AtomicUsize::new(0),
            registered: AtomicUsize::new(0),
            standby: SpinLock::new(Vec::new()),
        })
    }

    /// In the child of a `fork`, which has only the forking thread, with the reactor's locks
    /// held (see `fork_hold`): the epoll instance and the eventfd are the parent's (the two
    /// processes would take each other's events), and the poller role, the standby list and
    /// the registrations' waiters belong to threads and fibers that do not run here. Gives
    /// the child an epoll instance and an eventfd of its own under the same descriptor
    /// numbers, registers the inherited records' descriptors with it (an edge-triggered
    /// registration reports what is ready now), forgets the waiters (neither woken nor
    /// dropped: either would reach into the parent's schedulers, whose locks may be held
    /// here) and frees the role.
    fn after_fork_in_child(
        &self,
        records: &[Option<Arc<IoRecord>>],
        standby: &mut Vec<(Weak<Shared>, usize)>,
    ) {
        let fresh = |made: libc::c_int, onto: RawFd| {
            if made >= 0 {
                // Raw system calls: with the `hook` feature the C names are fibra's own
                // hooks, which take the fd table's locks, and this handler may run before
                // the hooks' own child handler tells them they are in a child.
                // SAFETY: `made` is a descriptor just created here; `dup3` replaces `onto`,
                // which this reactor owns, atomically, and the original is closed.
                unsafe {
                    libc::syscall(libc::SYS_dup3, made, onto, libc::O_CLOEXEC);
                    libc::syscall(libc::SYS_close, made);
                }
            }
        };
        // SAFETY: plain system calls creating new descriptors.
        fresh(
            unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) },
            self.epoll.as_raw_fd(),
        );
        // SAFETY: as above.
        fresh(
            unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) },
            self.wake.as_raw_fd(),
        );
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: WAKE_TOKEN,
        };
        // SAFETY: both descriptors are ours; `ev` lives across the call.
        unsafe {
            libc::epoll_ctl(
                self.epoll.as_raw_fd(),
                libc::EPOLL_CTL_ADD,
                self.wake.as_raw_fd(),
                &mut ev,
            )
        };
        for (idx, record) in records.iter().enumerate() {
            let Some(record) = record else { continue };
            let mut ev = libc::epoll_event {
                events: REGISTERED_EVENTS,
                u64: (u64::from(record.generation) << 32) | idx as u64,
            };
            // SAFETY: as above; a descriptor closed meanwhile is an error, ignored.
            unsafe {
                libc::epoll_ctl(
                    self.epoll.as_raw_fd(),
                    libc::EPOLL_CTL_ADD,
                    record.fd,
                    &mut ev,
                )
            };
            // SAFETY: `fork_hold` locked these waiters on this thread, the only one here.
            unsafe { record.waiters.fork_held() }.forget_in_child();
        }
        self.waiting.store(0, Ordering::SeqCst);
        self.shared_waiting.store(0, Ordering::SeqCst);
        standby.clear();
        self.polling.store(false, Ordering::SeqCst);
    }

    /// Registers `fd` (edge-triggered, both directions) and returns its record. If `fd` is
    /// already registered, returns the existing record.
    pub(crate) fn register(&self, fd: RawFd) -> io::Result<Arc<IoRecord>> {
        let idx = usize::try_from(fd).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
        let mut records = self.records.lock();
        let existing = records.get(idx).cloned().flatten();
        // The registration of this number, locked until the shared instance has answered:
        // a fiber moving its fd home (which holds this lock) must not take the fd out of the
        // shared instance between the look at its home and the add below, or the add would
        // succeed and the same open file be taken for a new one.
        let held = existing.as_ref().map(|e| e.waiters.lock());
        // An fd moved into a worker's own instance is not in the shared one, where adding
        // it succeeds: ask its home whether it is still the same open file.
        if let (Some(e), Some(waiters)) = (&existing, &held) {
            if waiters.still_home(e) {
                return Ok(e.clone());
            }
        }
        let generation = self.generation.fetch_add(1, Ordering::Relaxed) as u32;
        let record = Arc::new(IoRecord {
            fd,
            generation,
            readiness: AtomicU64::new(0),
            waiters: SpinLock::new(Waiters::new()),
            next_waiter: AtomicU64::new(0),
        });
        let mut ev = libc::epoll_event {
            events: REGISTERED_EVENTS,
            u64: (u64::from(generation) << 32) | idx as u64,
        };
        // SAFETY: the epoll fd is ours; `ev` lives across the call; a bad `fd` is an error.
        let r =
            unsafe { libc::epoll_ctl(self.epoll.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EEXIST) {
                if let Some(existing) = &existing {
                    return Ok(existing.clone());
                }
            }
            return Err(e);
        }
        // Closing a replaced registration below takes its lock.
        drop(held);
        if records.len() <= idx {
            records.resize(idx + 1, None);
        }
        match records[idx].replace(record.clone()) {
            // The fd was closed behind our back and its number reused: wake the old waiters.
            Some(stale) => stale.close(),
            None => {
                self.registered.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(record)
    }

    /// Whether `record` is still the registration of its fd (not deregistered by its owner,
    /// nor replaced after the fd number was reused).
    #[cfg(feature = "hook")]
    pub(crate) fn is_current(&self, record: &IoRecord) -> bool {
        self.records
            .lock()
            .get(record.fd as usize)
            .and_then(|r| r.as_ref())
            .is_some_and(|r| r.generation == record.generation)
    }

    /// Removes `record` before its fd is closed; its waiters wake with a hang-up.
    pub(crate) fn deregister(&self, record: &IoRecord) {
        let idx = record.fd as usize;
        {
            let mut records = self.records.lock();
            if let Some(slot) = records.get_mut(idx) {
                if slot
                    .as_ref()
                    .is_some_and(|r| r.generation == record.generation)
                {
                    *slot = None;
                    self.registered.fetch_sub(1, Ordering::Relaxed);
                }
            }
        }
        record.waiters.lock().leave_home(record.fd);
        self.remove_from_shared(record.fd);
        record.close();
    }

    /// [`deregister`](Reactor::deregister) by fd number.
    pub(crate) fn deregister_fd(&self, fd: RawFd) {
        let record = usize::try_from(fd)
            .ok()
            .and_then(|i| self.records.lock().get(i).cloned().flatten());
        if let Some(record) = record {
            self.deregister(&record);
        }
    }

    /// Cancels every readiness continuation of the scheduler behind `shared` (its shutdown
    /// gave up waiting); returns how many. Each is dropped outside every lock: dropping one
    /// closes the socket it holds, which deregisters that socket's record.
    pub(crate) fn cancel_continuations(&self, shared: &Shared) -> usize {
        let records: Vec<Arc<IoRecord>> = self.records.lock().iter().flatten().cloned().collect();
        let mut taken = Vec::new();
        for r in &records {
            r.take_continuations_of(shared, &mut taken);
        }
        drop(records);
        let n = taken.len();
        for c in taken {
            c.cancel();
        }
        n
    }

    /// Whether anybody waits for readiness of an fd in the shared instance: then some
    /// worker must poll it.
    pub(crate) fn has_waiters(&self) -> bool {
        self.shared_waiting.load(Ordering::SeqCst) != 0
    }

    /// The shared epoll instance.
    pub(super) fn epoll_fd(&self) -> RawFd {
        self.epoll.as_raw_fd()
    }

    /// Adds `fd` to the shared instance with event `data` `token`.
    pub(super) fn add_to_shared(&self, fd: RawFd, token: u64) -> io::Result<()> {
        super::home::ctl(
            self.epoll.as_raw_fd(),
            libc::EPOLL_CTL_ADD,
            fd,
            REGISTERED_EVENTS,
            token,
        )
    }

    /// Removes `fd` from the shared instance (it moved into a worker's own, or goes).
    pub(super) fn remove_from_shared(&self, fd: RawFd) {
        super::home::del(self.epoll.as_raw_fd(), fd);
    }

    /// Takes the poller role if it is free.
    pub(crate) fn try_begin_poll(&self) -> bool {
        !self.polling.load(Ordering::Relaxed)
            && self
                .polling
                .compare_exchange(false, true, Ordering::SeqCst, Ordering::Relaxed)
                .is_ok()
    }

    /// Gives the poller role back. The caller goes on to run fibers (or looks for work)
    /// rather than wait in `epoll_wait`, so a worker that found the role taken and sleeps on
    /// the standby list is woken to take it ([`hand_off`](Reactor::hand_off)): otherwise, while
    /// fibers wait for I/O, nobody would see their readiness until the caller's next look.
    pub(crate) fn end_poll(&self) {
        self.polling.store(false, Ordering::SeqCst);
        self.hand_off();
    }

    /// Puts worker `index` of `shared` on the standby list, for as long as the guard lives;
    /// `None` if the poller role is free by now while fds in the shared instance are waited
    /// for (the caller should take the role rather than sleep). The checks come after
    /// joining the list, and `hand_off` looks at the list after the role was released or the
    /// first waiter came: one of the two sees the other.
    pub(crate) fn stand_by(&self, shared: &Arc<Shared>, index: usize) -> Option<Standby<'_>> {
        self.standby.lock().push((Arc::downgrade(shared), index));
        let guard = Standby {
            reactor: self,
            shared: Arc::as_ptr(shared),
            index,
        };
        (self.polling.load(Ordering::SeqCst) || !self.has_waiters()).then_some(guard)
    }

    /// The poller role is free (it was given back, or a worker thread stops driving its
    /// loop) or the shared instance got its first waiter: if anybody waits for an fd in the
    /// shared instance and nobody polls it, wakes a worker on the standby list to take the
    /// role.
    pub(crate) fn hand_off(&self) {
        if !self.has_waiters() || self.polling.load(Ordering::SeqCst) {
            return;
        }
        let next = self.standby.lock().pop();
        if let Some((shared, index)) = next {
            if let Some(shared) = shared.upgrade() {
                shared.workers[index].sleep.wake();
            }
        }
    }

    /// Interrupts a blocked `epoll_wait` on the shared instance.
    pub(crate) fn wake(&self) {
        super::home::write_one(self.wake.as_raw_fd());
    }

    /// Waits for events at most `timeout` (`None`: until one arrives or `wake`) and wakes the
    /// fibers they concern. The caller holds the poller role.
    pub(crate) fn poll(&self, timeout: Option<Duration>) {
        let mut events = [libc::epoll_event { events: 0, u64: 0 }; EVENTS];
        let n = epoll_wait_on(self.epoll.as_raw_fd(), &mut events, timeout);
        if n > 0 {
            self.dispatch(&events[..n as usize], self.wake.as_raw_fd());
        }
    }

    /// Records the readiness `events` report (of the shared instance or a worker's own,
    /// whose eventfd is `wake`) and wakes the waiters they concern; whether one of them said
    /// the shared instance, nested in a worker's own, has events (see `HomePoll::poll`).
    pub(super) fn dispatch(&self, events: &[libc::epoll_event], wake: RawFd) -> bool {
        let mut shared = false;
        // The records are looked up under the lock and woken after it, so that registering
        // threads do not spin through the wake-ups.
        let mut ready: [(Option<Arc<IoRecord>>, u32); EVENTS] = [const { (None, 0) }; EVENTS];
        let records = self.records.lock();
        for (ev, slot) in events.iter().zip(&mut ready) {
            let data = ev.u64;
            if data == WAKE_TOKEN {
                super::home::read_all(wake);
                continue;
            }
            if data == super::home::SHARED_TOKEN {
                shared = true;
                continue;
            }
            let idx = (data & 0xFFFF_FFFF) as usize;
            let generation = (data >> 32) as u32;
            let Some(Some(record)) = records.get(idx) else {
                continue;
            };
            if record.generation != generation {
                continue;
            }
            let e = ev.events;
            let mut bits = 0;
            if e & (libc::EPOLLIN | libc::EPOLLPRI) as u32 != 0 {
                bits |= READABLE;
            }
            if e & libc::EPOLLOUT as u32 != 0 {
                bits |= WRITABLE;
            }
            if e & libc::EPOLLRDHUP as u32 != 0 {
                // The peer shut down its side, or this side its receiving: reads return
                // end-of-file; writes still work.
                bits |= READABLE | READ_SHUT;
            }
            if e & (libc::EPOLLHUP | libc::EPOLLERR) as u32 != 0 {
                // Hung up or failed: reads and writes both return at once (data, 0 or an
                // error), so every waiter wakes and none can wait again.
                bits |= READABLE | WRITABLE | CLOSED;
            }
            *slot = (Some(record.clone()), bits);
        }
        drop(records);
        for (record, bits) in &ready[..events.len()] {
            if let Some(record) = record {
                record.set_ready(*bits);
            }
        }
        shared
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The poller role released with a fiber waiting for I/O: a worker that found the role
    /// taken and sleeps on the standby list is woken to take it, whether the poller stops
    /// after a non-blocking look (a busy worker's) or after its sleep in `epoll_wait` (it has
    /// fibers to run now): otherwise nobody would be in `epoll_wait` until the poller's next
    /// idle pass, however long its fibers run.
    #[test]
    fn a_released_poller_role_wakes_a_worker_standing_by() {
        // A reactor of the test's own, so that no other test's worker polls it.
        let r = Reactor::new().expect("a reactor");
        r.shared_waiting.store(1, Ordering::SeqCst);
        let sched = crate::Scheduler::builder()
            .threads(1)
            .build()
            .expect("a scheduler");
        assert!(r.try_begin_poll());
        let standby = r
            .stand_by(sched.shared(), 0)
            .expect("the role is taken: the worker stands by");
        r.end_poll();
        assert!(
            r.standby.lock().is_empty(),
            "the worker standing by was not woken to take the role"
        );
        drop(standby);
        // Nobody waiting for I/O: nobody is woken.
        r.shared_waiting.store(0, Ordering::SeqCst);
        assert!(r.try_begin_poll());
        let standby = r.stand_by(sched.shared(), 0).expect("stands by");
        r.end_poll();
        assert_eq!(r.standby.lock().len(), 1);
        drop(standby);
    }
}
