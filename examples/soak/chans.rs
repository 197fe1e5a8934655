//! Channels: mpsc and mpmc (unbounded, bounded, rendezvous), oneshot and broadcast, with
//! receivers dropped at random; `select!` and `select_biased!` with timeouts, `after`,
//! `tick`, `never` and cancellation tokens. Producers and consumers are tasks, the actor
//! itself (a fiber or a thread), and now and then a plain thread.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fibra::sync::mpmc::SendTimeoutError;
use fibra::sync::mpsc::{RecvTimeoutError, TryRecvError, TrySendError};
use fibra::sync::{broadcast, mpmc, mpsc, oneshot, CancellationToken, RwLock};

use crate::acct::{fail, Fifo, Kind, Msg, Op, Tracked, ACCT};
use crate::rng::Rng;
use crate::tasks::work;
use crate::Round;

pub fn step(r: &Arc<Round>, rng: &mut Rng) -> Op {
    const OPS: [(Op, u32); 5] = [
        (Op::Mpsc, 10),
        (Op::Mpmc, 8),
        (Op::Oneshot, 6),
        (Op::Broadcast, 6),
        (Op::Select, 10),
    ];
    let op = OPS[rng.weighted(&OPS.map(|o| o.1))].0;
    match op {
        Op::Mpsc => mpsc_op(r, rng),
        Op::Mpmc => mpmc_op(r, rng),
        Op::Oneshot => oneshot_op(r, rng),
        Op::Broadcast => broadcast_op(r, rng),
        _ => select_op(r, rng),
    }
    op
}

/// Waits a moment between two polls: a yield in a fiber, a short sleep on a thread.
fn pause() {
    if fibra::Fiber::current().is_some() {
        fibra::Fiber::yield_now();
    } else {
        std::thread::sleep(Duration::from_micros(50));
    }
}

/// Any sending half of an mpsc or mpmc channel.
#[derive(Clone)]
enum Tx {
    Mpsc(mpsc::Sender<Msg>),
    MpscSync(mpsc::SyncSender<Msg>),
    Mpmc(mpmc::Sender<Msg>),
    MpmcSync(mpmc::SyncSender<Msg>),
}

/// How a send went: sent, or the message back, with whether the receivers are gone.
type Sent = Result<(), (Msg, bool)>;

impl Tx {
    /// One send, one of the ways the sender has.
    fn send(&self, m: Msg, rng: &mut Rng) -> Sent {
        let how = rng.below(3);
        let timeout = Duration::from_micros(rng.range(0, 2000));
        let try_err = |e: TrySendError<Msg>| match e {
            TrySendError::Full(m) => (m, false),
            TrySendError::Disconnected(m) => (m, true),
        };
        let timeout_err = |e: SendTimeoutError<Msg>| match e {
            SendTimeoutError::Timeout(m) => (m, false),
            SendTimeoutError::Disconnected(m) => (m, true),
        };
        match (self, how) {
            (Tx::Mpsc(tx), _) => tx.send(m).map_err(|e| (e.0, true)),
            (Tx::MpscSync(tx), 0) => tx.send(m).map_err(|e| (e.0, true)),
            (Tx::MpscSync(tx), _) => tx.try_send(m).map_err(try_err),
            (Tx::Mpmc(tx), 0) => tx.send(m).map_err(|e| (e.0, true)),
            (Tx::Mpmc(tx), 1) => tx.try_send(m).map_err(try_err),
            (Tx::Mpmc(tx), _) => tx.send_timeout(m, timeout).map_err(timeout_err),
            (Tx::MpmcSync(tx), 0) => tx.send(m).map_err(|e| (e.0, true)),
            (Tx::MpmcSync(tx), 1) => tx.try_send(m).map_err(try_err),
            (Tx::MpmcSync(tx), _) => tx.send_timeout(m, timeout).map_err(timeout_err),
        }
    }
}

/// Sends `n` messages as producer `id`, in order; stops when the receivers are gone (the
/// message comes back and is counted refused).
fn produce(tx: Tx, kind: Kind, id: u32, n: u64, rng: &mut Rng) {
    for seq in 0..n {
        let mut m = Msg::new(kind, id, seq);
        loop {
            match tx.send(m, rng) {
                Ok(()) => break,
                Err((back, true)) => {
                    back.refused();
                    return;
                }
                Err((back, false)) => {
                    m = back;
                    pause();
                }
            }
        }
        if rng.chance(10) {
            work(rng);
        }
    }
}

/// Any receiving half of an mpsc or mpmc channel.
enum Rx {
    Mpsc(mpsc::Receiver<Msg>),
    Mpmc(mpmc::Receiver<Msg>),
}

impl Rx {
    /// One receive, one of the ways: a message, `Ok(None)` if none came (try or timeout),
    /// `Err(())` once every sender is gone and the channel is empty.
    fn recv(&self, rng: &mut Rng) -> Result<Option<Msg>, ()> {
        let timeout = Duration::from_micros(rng.range(0, 3000));
        let how = rng.below(3);
        let t = |r: Result<Msg, TryRecvError>| match r {
            Ok(m) => Ok(Some(m)),
            Err(TryRecvError::Empty) => Ok(None),
            Err(TryRecvError::Disconnected) => Err(()),
        };
        let tm = |r: Result<Msg, RecvTimeoutError>| match r {
            Ok(m) => Ok(Some(m)),
            Err(RecvTimeoutError::Timeout) => Ok(None),
            Err(RecvTimeoutError::Disconnected) => Err(()),
        };
        match (self, how) {
            (Rx::Mpsc(rx), 0) => rx.recv().map(Some).map_err(|_| ()),
            (Rx::Mpsc(rx), 1) => t(rx.try_recv()),
            (Rx::Mpsc(rx), _) => tm(rx.recv_timeout(timeout)),
            (Rx::Mpmc(rx), 0) => rx.recv().map(Some).map_err(|_| ()),
            (Rx::Mpmc(rx), 1) => t(rx.try_recv()),
            (Rx::Mpmc(rx), _) => tm(rx.recv_timeout(timeout)),
        }
    }
}

/// Receives up to `want` messages (fewer if the senders all go), checking each producer's
/// order; returns how many.
fn consume(rx: &Rx, want: u64, what: &str, rng: &mut Rng) -> u64 {
    let mut fifo = Fifo::default();
    let mut got = 0;
    while got < want {
        match rx.recv(rng) {
            Ok(Some(m)) => {
                fifo.receive(m, what);
                got += 1;
            }
            Ok(None) => pause(),
            Err(()) => break,
        }
    }
    got
}

/// A bound: unbounded (`None`), rendezvous, or a few.
fn bound(rng: &mut Rng) -> Option<usize> {
    match rng.below(4) {
        0 => None,
        1 => Some(0),
        _ => Some(rng.range_usize(1, 8)),
    }
}

/// Starts producer `id` as a task, or now and then as a plain thread.
fn start_producer(r: &Arc<Round>, rng: &mut Rng, tx: Tx, kind: Kind, id: u32, n: u64) -> Producer {
    let mut prng = rng.fork();
    if rng.chance(10) {
        Producer::Thread(
            std::thread::Builder::new()
                .name("soak-producer".into())
                .spawn(move || produce(tx, kind, id, n, &mut prng))
                .expect("a producer thread"),
        )
    } else {
        Producer::Task(r.spawn(rng, move || produce(tx, kind, id, n, &mut prng)))
    }
}

enum Producer {
    Task(Tracked<()>),
    Thread(std::thread::JoinHandle<()>),
}

impl Producer {
    fn join(self) {
        match self {
            Producer::Task(t) => {
                check!(
                    t.join("a producer").completed().is_some(),
                    "a producer did not complete"
                );
            }
            Producer::Thread(t) => check!(t.join().is_ok(), "a producer thread panicked"),
        }
    }
}

/// Producers into one mpsc channel; the caller receives some, then drops the receiver.
fn mpsc_op(r: &Arc<Round>, rng: &mut Rng) {
    let (tx, rx) = match bound(rng) {
        None => {
            let (tx, rx) = mpsc::channel();
            (Tx::Mpsc(tx), rx)
        }
        Some(b) => {
            let (tx, rx) = mpsc::sync_channel(b);
            (Tx::MpscSync(tx), rx)
        }
    };
    let p = rng.range(1, 4) as u32;
    let n = rng.range(0, 40);
    let producers: Vec<_> = (0..p)
        .map(|id| start_producer(r, rng, tx.clone(), Kind::Mpsc, id, n))
        .collect();
    drop(tx);
    let rx = Rx::Mpsc(rx);
    let want = rng.range(0, u64::from(p) * n + 1);
    consume(&rx, want, "mpsc", rng);
    if rng.chance(30) {
        work(rng);
    }
    drop(rx); // the rest are dropped with it, and the producers' sends fail
    for pr in producers {
        pr.join();
    }
}

/// Producers and consumers of one mpmc channel; each consumer drops its receiver when it has
/// had enough.
fn mpmc_op(r: &Arc<Round>, rng: &mut Rng) {
    let (tx, rx) = match bound(rng) {
        None => {
            let (tx, rx) = mpmc::channel();
            (Tx::Mpmc(tx), rx)
        }
        Some(b) => {
            let (tx, rx) = mpmc::sync_channel(b);
            (Tx::MpmcSync(tx), rx)
        }
    };
    let p = rng.range(1, 3) as u32;
    let n = rng.range(0, 40);
    let producers: Vec<_> = (0..p)
        .map(|id| start_producer(r, rng, tx.clone(), Kind::Mpmc, id, n))
        .collect();
    drop(tx);
    let c = rng.range(1, 3);
    let consumers: Vec<_> = (0..c)
        .map(|_| {
            let rx = Rx::Mpmc(rx.clone());
            let want = rng.range(0, u64::from(p) * n + 1);
            let mut crng = rng.fork();
            r.spawn(rng, move || consume(&rx, want, "mpmc", &mut crng))
        })
        .collect();
    let rx = Rx::Mpmc(rx);
    let want = rng.range(0, 10);
    consume(&rx, want, "mpmc", rng);
    drop(rx);
    for h in consumers {
        check!(
            h.join("an mpmc consumer").completed().is_some(),
            "an mpmc consumer failed"
        );
    }
    for pr in producers {
        pr.join();
    }
}

/// A oneshot: sent or not, received, waited for with a timeout, or dropped unreceived.
fn oneshot_op(r: &Arc<Round>, rng: &mut Rng) {
    let (tx, mut rx) = oneshot::channel::<Msg>();
    let sends = rng.chance(80);
    let mut trng = rng.fork();
    let sender = r.spawn(rng, move || {
        work(&mut trng);
        if sends {
            if let Err(m) = tx.send(Msg::new(Kind::Oneshot, 0, 0)) {
                m.refused();
            }
        } else {
            drop(tx);
        }
    });
    match rng.below(4) {
        0 => match rx.recv() {
            Ok(m) => {
                m.received();
            }
            Err(_) => check!(!sends, "oneshot: a sent value was not received"),
        },
        1 => loop {
            match rx.recv_timeout(Duration::from_micros(rng.range(0, 2000))) {
                Ok(m) => {
                    m.received();
                    break;
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    check!(!sends, "oneshot: a sent value was not received");
                    break;
                }
            }
        },
        2 => loop {
            match rx.try_recv() {
                Ok(m) => {
                    m.received();
                    break;
                }
                Err(TryRecvError::Empty) => pause(),
                Err(TryRecvError::Disconnected) => {
                    check!(!sends, "oneshot: a sent value was not received");
                    break;
                }
            }
        },
        _ => {
            if rng.chance(50) {
                work(rng);
            }
            drop(rx); // dropped, with the value if it came
        }
    }
    check!(
        sender.join("a oneshot sender").completed().is_some(),
        "a oneshot sender failed"
    );
}

/// One broadcast operation's deliveries and their ends, checked when it is over.
#[derive(Default)]
struct BcCounts {
    deliveries: AtomicU64,
    received: AtomicU64,
    lagged: AtomicU64,
    dropped: AtomicU64,
}

/// Receives up to `want` broadcast messages, checking their order and that a lag skips
/// exactly what it says; then drops the receiver, counting what it had yet to receive.
/// `gate`, taken for writing, keeps sends out meanwhile.
fn bc_receive(
    mut rx: broadcast::Receiver<u64>,
    want: u64,
    gate: &RwLock<()>,
    c: &BcCounts,
    rng: &mut Rng,
) {
    let mut expected: Option<u64> = None;
    let mut got = 0;
    let seen = |v: u64, expected: &mut Option<u64>| {
        if let Some(e) = *expected {
            check!(v == e, "broadcast: received {v}, expected {e}");
        }
        *expected = Some(v + 1);
        c.received.fetch_add(1, Ordering::SeqCst);
    };
    let lag = |n: u64, expected: &mut Option<u64>| {
        check!(n > 0, "broadcast: a lag of 0");
        *expected = expected.map(|e| e + n);
        c.lagged.fetch_add(n, Ordering::SeqCst);
    };
    while got < want {
        match rng.below(3) {
            0 => match rx.recv() {
                Ok(v) => seen(v, &mut expected),
                Err(broadcast::RecvError::Lagged(n)) => lag(n, &mut expected),
                Err(broadcast::RecvError::Closed) => break,
            },
            1 => match rx.try_recv() {
                Ok(v) => seen(v, &mut expected),
                Err(broadcast::TryRecvError::Lagged(n)) => lag(n, &mut expected),
                Err(broadcast::TryRecvError::Empty) => pause(),
                Err(broadcast::TryRecvError::Closed) => break,
            },
            _ => match rx.recv_timeout(Duration::from_micros(rng.range(0, 2000))) {
                Ok(v) => seen(v, &mut expected),
                Err(broadcast::RecvTimeoutError::Lagged(n)) => lag(n, &mut expected),
                Err(broadcast::RecvTimeoutError::Timeout) => {}
                Err(broadcast::RecvTimeoutError::Closed) => break,
            },
        }
        got += 1;
        if rng.chance(5) {
            work(rng);
        }
    }
    let _g = gate.write().expect("never poisoned");
    c.dropped.fetch_add(rx.len() as u64, Ordering::SeqCst);
    drop(rx);
}

/// A broadcast channel: the caller sends, receivers (tasks, some subscribed mid-stream)
/// receive some, lag, and drop. Deliveries = received + lagged over + dropped unreceived.
fn broadcast_op(r: &Arc<Round>, rng: &mut Rng) {
    let cap = rng.range_usize(1, 16);
    let (tx, rx0) = broadcast::channel::<u64>(cap);
    let gate = Arc::new(RwLock::new(()));
    let c = Arc::new(BcCounts::default());
    let start = |rx: broadcast::Receiver<u64>, rng: &mut Rng| {
        let (g, c) = (gate.clone(), c.clone());
        let want = rng.range(0, 60);
        let mut trng = rng.fork();
        r.spawn(rng, move || bc_receive(rx, want, &g, &c, &mut trng))
    };
    let mut receivers = vec![start(rx0, rng)];
    for _ in 0..rng.range(0, 3) {
        receivers.push(start(tx.subscribe(), rng));
    }
    let sends = rng.range(0, 50);
    let mut seq = 0u64;
    for _ in 0..sends {
        {
            let _g = gate.read().expect("never poisoned");
            match tx.send(seq) {
                Ok(n) => {
                    c.deliveries.fetch_add(n as u64, Ordering::SeqCst);
                    seq += 1;
                }
                Err(_) => ACCT.bc_refused.inc(),
            }
        }
        if rng.chance(5) {
            receivers.push(start(tx.subscribe(), rng));
        }
        if rng.chance(20) {
            pause();
        }
    }
    drop(tx);
    for h in receivers {
        check!(
            h.join("a broadcast receiver").completed().is_some(),
            "a broadcast receiver failed"
        );
    }
    let (d, rc, l, dr) = (
        c.deliveries.load(Ordering::SeqCst),
        c.received.load(Ordering::SeqCst),
        c.lagged.load(Ordering::SeqCst),
        c.dropped.load(Ordering::SeqCst),
    );
    check!(
        d == rc + l + dr,
        "broadcast: {d} deliveries, {rc} received, {l} lagged over, {dr} dropped unreceived"
    );
    ACCT.bc_deliveries.add(d);
    ACCT.bc_received.add(rc);
    ACCT.bc_lagged.add(l);
    ACCT.bc_dropped.add(dr);
}

fn select_op(r: &Arc<Round>, rng: &mut Rng) {
    match rng.below(6) {
        0 => select_recv(r, rng),
        1 => select_rendezvous(r, rng),
        2 => select_buffered(r, rng),
        3 => select_indexed(r, rng),
        4 => select_arms(r, rng),
        _ => select_biased(rng),
    }
}

/// `Select` (operations added at run time, by index) over a few channels, each removed once
/// its senders are gone, with timeouts.
fn select_indexed(r: &Arc<Round>, rng: &mut Rng) {
    let k = rng.range(1, 4) as u32;
    let mut rxs = Vec::new();
    let mut producers = Vec::new();
    for id in 0..k {
        let (tx, rx) = match bound(rng) {
            None => {
                let (tx, rx) = mpsc::channel();
                (Tx::Mpsc(tx), rx)
            }
            Some(b) => {
                let (tx, rx) = mpsc::sync_channel(b);
                (Tx::MpscSync(tx), rx)
            }
        };
        let n = rng.range(0, 20);
        producers.push(start_producer(r, rng, tx, Kind::Mpsc, id, n));
        rxs.push(rx);
    }
    let mut sel = if rng.chance(50) {
        fibra::sync::Select::new()
    } else {
        fibra::sync::Select::new_biased()
    };
    let index: Vec<usize> = rxs.iter().map(|rx| sel.recv(rx)).collect();
    let mut fifo = Fifo::default();
    let mut live = rxs.len();
    let mut timeouts = 0;
    while live > 0 && timeouts < 20 {
        match sel.select_timeout(Duration::from_micros(rng.range(0, 5000))) {
            Ok(op) => {
                let i = op.index();
                let Some(j) = index.iter().position(|&x| x == i) else {
                    fail(format!("Select: chose index {i}, never added"));
                    return;
                };
                match op.recv(&rxs[j]) {
                    Ok(m) => fifo.receive(m, "Select"),
                    Err(_) => {
                        sel.remove(i);
                        live -= 1;
                    }
                }
            }
            Err(_) => timeouts += 1,
        }
    }
    drop(sel);
    drop(rxs);
    for p in producers {
        p.join();
    }
}

/// `SelectArms`, a closure per operation: a receive from a producer's channel, or a send
/// (its message made up front: dropped unsent if the receive completes) to a consumer that
/// takes everything.
fn select_arms(r: &Arc<Round>, rng: &mut Rng) {
    let (tx, rx) = mpsc::channel::<Msg>();
    let n = rng.range(0, 20);
    let producer = start_producer(r, rng, Tx::Mpsc(tx), Kind::Mpsc, 0, n);
    let (ctx, crx) = if rng.chance(50) {
        mpsc::sync_channel::<Msg>(0)
    } else {
        mpsc::sync_channel::<Msg>(rng.range_usize(1, 3))
    };
    let mut crng = rng.fork();
    let consumer = r.spawn(rng, move || {
        consume(&Rx::Mpsc(crx), u64::MAX, "SelectArms (sends)", &mut crng)
    });
    enum Done {
        Got,
        Gone,
        Sent,
    }
    let mut fifo = Fifo::default();
    let mut sent = 0u64;
    let mut seq = 0u64;
    for _ in 0..rng.range(0, 40) {
        let timeout = Duration::from_micros(rng.range(0, 3000));
        let fifo = &mut fifo;
        let mut arms = fibra::sync::SelectArms::new();
        arms.recv(&rx, |m| match m {
            Ok(m) => {
                fifo.receive(m, "SelectArms");
                Done::Got
            }
            Err(_) => Done::Gone,
        })
        .send(&ctx, Msg::offer(Kind::Select, 2, seq), |res| match res {
            Ok(()) => Done::Sent,
            Err(e) => {
                e.0.refused();
                fail("SelectArms: a send failed with its consumer alive".into());
                Done::Gone
            }
        });
        let done = arms.wait_timeout(timeout);
        match done {
            Some(Done::Sent) => {
                sent += 1;
                seq += 1;
            }
            Some(Done::Gone) => break,
            Some(Done::Got) | None => {}
        }
    }
    drop(ctx);
    drop(rx);
    producer.join();
    let got = consumer.join("a SelectArms consumer").completed();
    check!(
        got == Some(sent),
        "SelectArms: {sent} sends completed, {got:?} received"
    );
}

/// Receives from two channels until a token is cancelled, a deadline (`after`) passes, a
/// channel is disconnected or `default(timeout)` has fired a few times.
fn select_recv(r: &Arc<Round>, rng: &mut Rng) {
    let (atx, arx) = mpsc::channel::<Msg>();
    let (btx, brx) = if rng.chance(50) {
        mpmc::sync_channel::<Msg>(rng.range_usize(0, 4))
    } else {
        mpmc::sync_channel::<Msg>(1)
    };
    let (na, nb) = (rng.range(0, 30), rng.range(0, 30));
    let pa = start_producer(r, rng, Tx::Mpsc(atx), Kind::Mpsc, 0, na);
    let pb = start_producer(r, rng, Tx::MpmcSync(btx), Kind::Mpmc, 1, nb);
    let token = CancellationToken::new();
    let t2 = token.clone();
    let delay = Duration::from_micros(rng.range(0, 20_000));
    let canceller = r.spawn(rng, move || {
        fibra::sleep(delay);
        t2.cancel();
    });
    let deadline = fibra::sync::after(Duration::from_micros(rng.range(0, 30_000)));
    let mut fa = Fifo::default();
    let mut fb = Fifo::default();
    let mut defaults = 0;
    let quiet = Duration::from_micros(rng.range(0, 3000));
    loop {
        let t0 = Instant::now();
        fibra::select! {
            recv(arx) -> m => match m {
                Ok(m) => fa.receive(m, "select (mpsc)"),
                Err(_) => break,
            },
            recv(brx) -> m => match m {
                Ok(m) => fb.receive(m, "select (mpmc)"),
                Err(_) => break,
            },
            recv(token) -> _ => break,
            recv(deadline) -> _ => break,
            default(quiet) => {
                check!(t0.elapsed() >= quiet, "select's default({quiet:?}) came after {:?}", t0.elapsed());
                defaults += 1;
                if defaults > 3 {
                    break;
                }
            }
        }
    }
    drop(arx);
    drop(brx);
    pa.join();
    pb.join();
    check!(
        canceller.join("a select's canceller").completed().is_some(),
        "a select's canceller failed"
    );
}

/// Sends through a rendezvous channel from `select!`, which offers each message while it
/// waits; an offer a receiver did not take is dropped unsent.
fn select_rendezvous(r: &Arc<Round>, rng: &mut Rng) {
    let (tx, rx) = mpsc::sync_channel::<Msg>(0);
    let want = rng.range(0, 20);
    let mut crng = rng.fork();
    let consumer = r.spawn(rng, move || {
        let rx = Rx::Mpsc(rx);
        consume(&rx, want, "select (rendezvous)", &mut crng)
    });
    let tick = fibra::sync::tick(Duration::from_micros(rng.range(200, 3000)));
    let mut seq = 0;
    let mut sent = 0;
    for _ in 0..rng.range(0, 40) {
        fibra::select! {
            send(tx, Msg::offer(Kind::Select, 0, seq)) -> res => match res {
                Ok(()) => {
                    seq += 1;
                    sent += 1;
                }
                Err(e) => {
                    e.0.refused();
                    break;
                }
            },
            recv(tick) -> t => check!(t.is_ok(), "a tick failed"),
            default(Duration::from_millis(5)) => {},
        }
    }
    drop(tx);
    match consumer.join("a rendezvous consumer").completed() {
        // A rendezvous send completes only when a receiver takes the message.
        Some(got) => check!(
            got == sent,
            "select (rendezvous): {sent} sent, {got} received (of {want} wanted)"
        ),
        None => fail("a rendezvous consumer failed".into()),
    }
}

/// Sends from `select!` into a buffered channel whose consumer takes everything: every
/// message made was sent, and every one sent received.
fn select_buffered(r: &Arc<Round>, rng: &mut Rng) {
    let (tx, rx) = mpmc::sync_channel::<Msg>(rng.range_usize(1, 4));
    let mut crng = rng.fork();
    let consumer = r.spawn(rng, move || {
        let rx = Rx::Mpmc(rx);
        consume(&rx, u64::MAX, "select (buffered)", &mut crng)
    });
    let (tx2, rx2) = mpsc::channel::<Msg>();
    let made = Cell::new(0u64);
    let mut sent = 0u64;
    let mut other = 0u64;
    for seq in 0..rng.range(0, 40) {
        if rng.chance(20) {
            tx2.send(Msg::new(Kind::Mpsc, 9, seq))
                .map_err(|_| ())
                .expect("rx2 lives");
        }
        fibra::select! {
            send(tx, {
                made.set(made.get() + 1);
                Msg::new(Kind::Select, 1, seq)
            }) -> res => match res {
                Ok(()) => sent += 1,
                Err(e) => {
                    e.0.refused();
                    fail("select (buffered): a send failed with its consumer alive".into());
                }
            },
            recv(rx2) -> m => {
                if let Ok(m) = m {
                    m.received();
                    other += 1;
                }
            },
        }
    }
    drop(tx);
    let got = consumer.join("a buffered consumer").completed();
    check!(
        made.get() == sent && got == Some(sent),
        "select (buffered): {} messages made, {sent} sent, {got:?} received",
        made.get()
    );
    let _ = other;
}

/// `select_biased!` with both channels ready takes the first.
fn select_biased(rng: &mut Rng) {
    let (atx, arx) = mpsc::channel::<Msg>();
    let (btx, brx) = mpmc::channel::<Msg>();
    let n = rng.range(1, 5);
    for seq in 0..n {
        atx.send(Msg::new(Kind::Mpsc, 0, seq))
            .map_err(|_| ())
            .expect("arx lives");
        btx.send(Msg::new(Kind::Mpmc, 1, seq))
            .map_err(|_| ())
            .expect("brx lives");
    }
    for _ in 0..n {
        fibra::select_biased! {
            recv(arx) -> m => match m {
                Ok(m) => { m.received(); }
                Err(_) => fail("select_biased: the first channel was disconnected".into()),
            },
            recv(brx) -> m => {
                if let Ok(m) = m {
                    m.received();
                }
                fail("select_biased: took the second of two ready channels".into());
            },
        }
    }
    // The rest are dropped with the receivers.
    drop((arx, brx, atx, btx));
}
