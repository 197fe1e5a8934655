//! The soak's accounting: counters (atomics), the ticket every task carries, the messages
//! that count themselves, and the record of failures.
//!
//! Every task the soak submits carries a [`Ticket`]: the task's body resolves it as
//! completed, panicked (only by design: a [`Designed`] payload) or cancelled (any other
//! unwind: fibra's cancellation), and a task dropped unrun resolves it as cancelled. Whoever
//! joins the task checks that the handle's result says the same ([`classify`]). So
//! `submitted = completed + cancelled + panicked` once the scheduler is quiet, and fibra's own
//! `Metrics::spawned` must equal `submitted`.
//!
//! Every channel message is a [`Msg`], counted when made and, exactly once, when it ends:
//! received, given back by a failed send (refused), dropped in a channel (with its receiver)
//! or, for a rendezvous send a `select!` offered and then did not make, dropped unsent. So
//! `sent = made - refused - unsent = received + dropped` when all is quiet.

use std::any::Any;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use fibra::JoinError;

/// A counter that only grows.
pub struct Counter(AtomicU64);

impl Counter {
    pub const fn new() -> Counter {
        Counter(AtomicU64::new(0))
    }
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::SeqCst);
    }
    pub fn inc(&self) {
        self.add(1);
    }
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// Defines the operation kinds, each with the name the summary prints.
macro_rules! ops {
    ($($name:ident = $text:literal,)*) => {
        /// A kind of operation an actor picks.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum Op { $($name,)* }
        impl Op {
            /// Every kind, in the summary's order.
            pub const ALL: &'static [Op] = &[$(Op::$name,)*];
            pub fn name(self) -> &'static str {
                match self { $(Op::$name => $text,)* }
            }
        }
    };
}

ops! {
    SpawnJoin = "spawn+join",
    SpawnFromThread = "spawn+join from a thread",
    BlockOn = "block_on",
    Futures = "future::block_on",
    Pinned = "pinned submit",
    Cancel = "cancel",
    YieldSleep = "yield/sleep",
    Park = "park/unpark",
    Panic = "panic by design",
    JoinSet = "JoinSet",
    Scope = "scope",
    SpawnLocal = "spawn_local",
    FiberLocal = "fiber_local",
    Continuation = "then/catching/finally",
    Mutex = "Mutex",
    RwLock = "RwLock",
    Condvar = "Condvar",
    Semaphore = "Semaphore",
    Barrier = "Barrier/WaitGroup",
    OnceLock = "OnceLock",
    Token = "CancellationToken",
    Mpsc = "mpsc",
    Mpmc = "mpmc",
    Oneshot = "oneshot",
    Broadcast = "broadcast",
    Select = "select!",
    Unblock = "unblock",
    Timer = "Timer",
    TcpEcho = "tcp echo",
    TcpAbort = "tcp closed mid-stream",
    Pool = "Pool",
    SecondSched = "second scheduler",
}

/// The kinds of channel a [`Msg`] travels through, for the per-kind figures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Mpsc,
    Mpmc,
    Oneshot,
    Select,
    Timer,
}

impl Kind {
    pub const ALL: [Kind; 5] = [
        Kind::Mpsc,
        Kind::Mpmc,
        Kind::Oneshot,
        Kind::Select,
        Kind::Timer,
    ];
    pub fn name(self) -> &'static str {
        match self {
            Kind::Mpsc => "mpsc",
            Kind::Mpmc => "mpmc",
            Kind::Oneshot => "oneshot",
            Kind::Select => "select! sends",
            Kind::Timer => "Timer jobs' mpsc",
        }
    }
}

/// One kind's message figures.
pub struct MsgCounts {
    pub made: Counter,
    pub received: Counter,
    pub dropped: Counter,
    pub refused: Counter,
    pub unsent: Counter,
}

impl MsgCounts {
    const fn new() -> MsgCounts {
        MsgCounts {
            made: Counter::new(),
            received: Counter::new(),
            dropped: Counter::new(),
            refused: Counter::new(),
            unsent: Counter::new(),
        }
    }
    /// Messages that ended, read before `made` (each ends after it is made).
    pub fn ended(&self) -> u64 {
        self.received.get() + self.dropped.get() + self.refused.get() + self.unsent.get()
    }
    /// Messages sent: made, less those a send gave back and those a select did not send.
    pub fn sent(&self) -> u64 {
        self.made.get() - self.refused.get() - self.unsent.get()
    }
}

/// Every figure of the run.
pub struct Acct {
    /// Moves at every operation: what the hang detector watches.
    pub progress: Counter,
    pub ops: [Counter; 64],
    // Tasks, all schedulers together (per scheduler: `SchedCounts`).
    pub submitted: Counter,
    pub completed: Counter,
    pub cancelled: Counter,
    pub cancelled_unstarted: Counter,
    pub panicked: Counter,
    // Panics by design: raised, and seen by the panic hook.
    pub panics_raised: Counter,
    pub panics_hooked: Counter,
    pub panics_unexpected: Counter,
    // Channels.
    pub msgs: [MsgCounts; 5],
    pub bc_deliveries: Counter,
    pub bc_received: Counter,
    pub bc_lagged: Counter,
    pub bc_dropped: Counter,
    pub bc_refused: Counter,
    // TCP.
    pub tcp_conns: Counter,
    pub bytes_written: Counter,
    pub bytes_verified: Counter,
    pub bytes_echoed: Counter,
    pub client_aborts: Counter,
    pub server_aborts: Counter,
    pub pool_connects: Counter,
    pub pool_broken: Counter,
    // Fiber-locals made and dropped.
    pub locals_made: Counter,
    pub locals_dropped: Counter,
    // Timer jobs.
    pub jobs_scheduled: Counter,
    pub jobs_ran: Counter,
    pub jobs_cancelled: Counter,
    pub jobs_dropped: Counter,
    // Parks.
    pub parks: Counter,
    pub parks_timed_out: Counter,
    // Second schedulers.
    pub second_scheds: Counter,
}

pub static ACCT: Acct = Acct {
    progress: Counter::new(),
    ops: [const { Counter::new() }; 64],
    submitted: Counter::new(),
    completed: Counter::new(),
    cancelled: Counter::new(),
    cancelled_unstarted: Counter::new(),
    panicked: Counter::new(),
    panics_raised: Counter::new(),
    panics_hooked: Counter::new(),
    panics_unexpected: Counter::new(),
    msgs: [const { MsgCounts::new() }; 5],
    bc_deliveries: Counter::new(),
    bc_received: Counter::new(),
    bc_lagged: Counter::new(),
    bc_dropped: Counter::new(),
    bc_refused: Counter::new(),
    tcp_conns: Counter::new(),
    bytes_written: Counter::new(),
    bytes_verified: Counter::new(),
    bytes_echoed: Counter::new(),
    client_aborts: Counter::new(),
    server_aborts: Counter::new(),
    pool_connects: Counter::new(),
    pool_broken: Counter::new(),
    locals_made: Counter::new(),
    locals_dropped: Counter::new(),
    jobs_scheduled: Counter::new(),
    jobs_ran: Counter::new(),
    jobs_cancelled: Counter::new(),
    jobs_dropped: Counter::new(),
    parks: Counter::new(),
    parks_timed_out: Counter::new(),
    second_scheds: Counter::new(),
};

/// Counts one operation of kind `op`, and progress.
pub fn did(op: Op) {
    ACCT.ops[op as usize].inc();
    ACCT.progress.inc();
}

pub fn msgs(kind: Kind) -> &'static MsgCounts {
    &ACCT.msgs[kind as usize]
}

// ---- failures ----

static SEED: AtomicU64 = AtomicU64::new(0);
static FAILURES: Mutex<Vec<String>> = Mutex::new(Vec::new());
/// Set at the first failure: every actor winds down, and the run reports.
static ABORT: AtomicBool = AtomicBool::new(false);

pub fn set_seed(seed: u64) {
    SEED.store(seed, Ordering::SeqCst);
}

pub fn seed() -> u64 {
    SEED.load(Ordering::SeqCst)
}

/// Records a failed check, prints it with the seed at once, and winds the run down.
pub fn fail(msg: String) {
    eprintln!("soak: FAILED (seed {}): {msg}", seed());
    FAILURES.lock().unwrap_or_else(|e| e.into_inner()).push(msg);
    ABORT.store(true, Ordering::SeqCst);
}

pub fn aborted() -> bool {
    ABORT.load(Ordering::SeqCst)
}

pub fn failures() -> Vec<String> {
    FAILURES.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Records a failure unless `cond` holds.
#[macro_export]
macro_rules! check {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            $crate::acct::fail(format!($($fmt)+));
        }
    };
}

// ---- panics by design ----

/// The payload of every panic the soak raises on purpose: the panic hook keeps quiet about
/// these, and a task that ends with one counts as panicked by design.
pub struct Designed(pub &'static str);

/// Panics by design.
pub fn designed_panic(place: &'static str) -> ! {
    ACCT.panics_raised.inc();
    std::panic::panic_any(Designed(place))
}

/// What a panic payload says, for a report.
pub fn describe(p: &(dyn Any + Send)) -> String {
    if let Some(d) = p.downcast_ref::<Designed>() {
        format!("a panic by design ({})", d.0)
    } else if let Some(s) = p.downcast_ref::<&str>() {
        format!("panic: {s}")
    } else if let Some(s) = p.downcast_ref::<String>() {
        format!("panic: {s}")
    } else {
        "a panic with an unknown payload (fibra's cancellation, if in a fiber)".into()
    }
}

// ---- tasks ----

/// The soak's count of the tasks it submitted to one scheduler, and how they ended.
pub struct SchedCounts {
    pub name: String,
    pub submitted: Counter,
    pub completed: Counter,
    pub cancelled: Counter,
    pub panicked: Counter,
}

impl SchedCounts {
    pub fn new(name: &str) -> Arc<SchedCounts> {
        Arc::new(SchedCounts {
            name: name.to_string(),
            submitted: Counter::new(),
            completed: Counter::new(),
            cancelled: Counter::new(),
            panicked: Counter::new(),
        })
    }
    /// Tasks that have ended (read this before `submitted`).
    pub fn resolved(&self) -> u64 {
        self.completed.get() + self.cancelled.get() + self.panicked.get()
    }
}

const PENDING: u8 = 0;
const COMPLETED: u8 = 1;
const CANCELLED: u8 = 2;
const PANICKED: u8 = 3;

fn outcome_name(o: u8) -> &'static str {
    match o {
        PENDING => "no outcome yet",
        COMPLETED => "completed",
        CANCELLED => "cancelled",
        PANICKED => "panicked",
        _ => "an unexpected error",
    }
}

/// Carried by every task the soak submits: resolved exactly once with how it ended.
pub struct Ticket {
    counts: Arc<SchedCounts>,
    outcome: Arc<AtomicU8>,
    started: bool,
}

/// The joining side of a ticket: how the task said it ended.
pub type Stub = Arc<AtomicU8>;

impl Ticket {
    /// A ticket for a task about to be submitted to the scheduler `counts` counts for.
    pub fn new(counts: &Arc<SchedCounts>) -> (Ticket, Stub) {
        counts.submitted.inc();
        ACCT.submitted.inc();
        let outcome = Arc::new(AtomicU8::new(PENDING));
        (
            Ticket {
                counts: counts.clone(),
                outcome: outcome.clone(),
                started: false,
            },
            outcome,
        )
    }

    fn resolve(&mut self, o: u8) {
        let before = self.outcome.swap(o, Ordering::SeqCst);
        if before != PENDING {
            fail(format!(
                "a task resolved twice: {} then {}",
                outcome_name(before),
                outcome_name(o)
            ));
            return;
        }
        let (mine, all) = match o {
            COMPLETED => (&self.counts.completed, &ACCT.completed),
            CANCELLED => (&self.counts.cancelled, &ACCT.cancelled),
            _ => (&self.counts.panicked, &ACCT.panicked),
        };
        mine.inc();
        all.inc();
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if self.outcome.load(Ordering::SeqCst) != PENDING {
            return;
        }
        if self.started {
            fail("a task's ticket was dropped, started, without an outcome".into());
        } else {
            // Dropped unrun: the task was cancelled before it started.
            ACCT.cancelled_unstarted.inc();
            self.resolve(CANCELLED);
        }
    }
}

/// `f` as a task body that resolves `ticket`: completed if `f` returns, panicked if it
/// unwinds with a [`Designed`] payload, cancelled if with anything else (fibra's
/// cancellation; any other panic has failed the run in the panic hook already).
pub fn wrap<T>(ticket: Ticket, f: impl FnOnce() -> T) -> impl FnOnce() -> T {
    move || {
        let mut ticket = ticket;
        ticket.started = true;
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
            Ok(v) => {
                ticket.resolve(COMPLETED);
                v
            }
            Err(p) => {
                ticket.resolve(if p.is::<Designed>() {
                    PANICKED
                } else {
                    CANCELLED
                });
                std::panic::resume_unwind(p)
            }
        }
    }
}

/// What a ticket says now, in words.
pub fn stub_says(stub: &Stub) -> &'static str {
    outcome_name(stub.load(Ordering::SeqCst))
}

/// How a joined task ended, as its handle said and its ticket agreed.
pub enum Outcome<T> {
    Completed(T),
    Cancelled,
    Panicked,
}

impl<T> Outcome<T> {
    pub fn completed(self) -> Option<T> {
        match self {
            Outcome::Completed(v) => Some(v),
            _ => None,
        }
    }
    pub fn is_cancelled(&self) -> bool {
        matches!(self, Outcome::Cancelled)
    }
    pub fn is_panicked(&self) -> bool {
        matches!(self, Outcome::Panicked)
    }
}

/// A joined task's result, checked against its ticket: the ticket was resolved before the
/// result was published (fibra drops the closure, and the body ends, before it publishes),
/// so the two must agree.
pub fn classify<T>(r: Result<T, JoinError>, stub: &Stub, what: &str) -> Outcome<T> {
    let (outcome, code) = match r {
        Ok(v) => (Outcome::Completed(v), COMPLETED),
        Err(e) if e.is_cancelled() => (Outcome::Cancelled, CANCELLED),
        Err(e) if e.is_panic() => {
            let p = e.into_panic();
            if !p.is::<Designed>() {
                fail(format!("{what}: joined an unexpected {}", describe(&*p)));
            }
            (Outcome::Panicked, PANICKED)
        }
        Err(e) => {
            fail(format!("{what}: an unexpected join error: {e}"));
            (Outcome::Cancelled, u8::MAX)
        }
    };
    let ticket = stub.load(Ordering::SeqCst);
    check!(
        ticket == code,
        "{what}: the handle says {}, the task's ticket says {}",
        outcome_name(code),
        outcome_name(ticket)
    );
    outcome
}

/// A submitted task's handle and its ticket's stub.
pub struct Tracked<T> {
    pub handle: fibra::JoinHandle<T>,
    pub stub: Stub,
}

impl<T> Tracked<T> {
    /// Joins the task and checks its result against its ticket.
    pub fn join(self, what: &str) -> Outcome<T> {
        let r = self.handle.join();
        classify(r, &self.stub, what)
    }
}

// ---- messages ----

/// A channel message that counts itself: made, then exactly one of received, refused (a
/// failed send gave it back), dropped (in a channel, with its receiver) or unsent (offered
/// by a `select!` that then completed another operation).
pub struct Msg {
    pub producer: u32,
    pub seq: u64,
    kind: Kind,
    offer: bool,
    ended: bool,
}

impl Msg {
    pub fn new(kind: Kind, producer: u32, seq: u64) -> Msg {
        msgs(kind).made.inc();
        Msg {
            producer,
            seq,
            kind,
            offer: false,
            ended: false,
        }
    }

    /// A message a `select!` makes for a rendezvous send it offers: dropped unsent if the
    /// select completes another operation.
    pub fn offer(kind: Kind, producer: u32, seq: u64) -> Msg {
        let mut m = Msg::new(kind, producer, seq);
        m.offer = true;
        m
    }

    /// Received: returns its producer and sequence number.
    pub fn received(mut self) -> (u32, u64) {
        self.ended = true;
        msgs(self.kind).received.inc();
        (self.producer, self.seq)
    }

    /// Given back by a send that failed.
    pub fn refused(mut self) {
        self.ended = true;
        msgs(self.kind).refused.inc();
    }
}

impl Drop for Msg {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        let c = msgs(self.kind);
        if self.offer {
            c.unsent.inc();
        } else {
            c.dropped.inc();
        }
    }
}

/// Checks that each producer's messages arrive in the order sent (FIFO per sender).
#[derive(Default)]
pub struct Fifo {
    last: std::collections::HashMap<u32, u64>,
}

impl Fifo {
    pub fn receive(&mut self, m: Msg, what: &str) {
        let (p, seq) = m.received();
        if let Some(prev) = self.last.insert(p, seq) {
            check!(
                seq > prev,
                "{what}: producer {p}'s message {seq} came after its message {prev}"
            );
        }
    }
}
