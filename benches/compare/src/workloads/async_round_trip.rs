//! async_round_trip: synchronous code asking an async task and waiting for the answer. A
//! client sends a number over a `tokio::sync::mpsc` channel (capacity 1) to an echo task on a
//! tokio runtime, which sends it back, plus one, over a second such channel; the client checks
//! the answer. 100 000 round trips one after another; figure: ns per round trip (the client's
//! own clock around its loop). The echo task and the channels are made afresh each repetition.
//!
//! fibra: the client is a fiber of a scheduler with N workers built with
//! `.tokio_handle(rt.handle().clone())` on the echo task's runtime (N tokio workers), and
//! makes each round trip with one `fibra::future::block_on(async { send; recv })`: between the
//! polls only the fiber waits. That is 2N threads in all, N of fibra's and N of tokio's.
//! tokio: the client is a tokio task on the same kind of runtime (N workers) running the same
//! loop with `.await`; N threads in all. may, Go and std have no async runtime to bridge to
//! (see `skip_reason`).

use std::time::{Duration, Instant};

use tokio::sync::mpsc::{channel, Receiver, Sender};

use super::{Cfg, Peer};
use crate::measure::{ns_per, repeat};
use crate::rt;

const ROUND_TRIPS: u64 = 100_000;
const CAPACITY: usize = 1;

/// Runs async_round_trip for `peer`: one figure (ns per round trip) per repetition, or why the peer has none.
pub fn run(peer: Peer, cfg: Cfg) -> Result<Vec<f64>, String> {
    match peer {
        Peer::Fibra => Ok(fibra(cfg)),
        Peer::Tokio => Ok(tokio(cfg)),
        Peer::May | Peer::Std | Peer::Go | Peer::FibraNet => {
            Err("no async runtime to bridge to".into())
        }
    }
}

/// The tokio side: answers every request with its number plus one, until the client hangs up.
async fn echo(mut requests: Receiver<u64>, answers: Sender<u64>) {
    while let Some(n) = requests.recv().await {
        answers
            .send(n + 1)
            .await
            .expect("client waits for its answer");
    }
}

/// One round trip of the client: ask, wait for the answer, check it.
async fn ask(requests: &Sender<u64>, answers: &mut Receiver<u64>, n: u64) {
    requests.send(n).await.expect("echo task is running");
    let answer = answers.recv().await.expect("echo task answers");
    assert_eq!(answer, n + 1, "the answer to request {n}");
}

/// Channels for one repetition, with the echo task spawned on `rt`: the client's ends.
fn start_echo(rt: &tokio::runtime::Runtime) -> (Sender<u64>, Receiver<u64>) {
    let (req_tx, req_rx) = channel(CAPACITY);
    let (ans_tx, ans_rx) = channel(CAPACITY);
    rt.spawn(echo(req_rx, ans_tx));
    (req_tx, ans_rx)
}

fn fibra(cfg: Cfg) -> Vec<f64> {
    let tokio = rt::tokio(cfg.threads);
    let sched = rt::fibra_with_tokio(cfg.threads, tokio.handle().clone());
    let v = repeat(cfg.warmup, cfg.reps, || {
        let (requests, mut answers) = start_echo(&tokio);
        let client = sched
            .submit(
                move || {
                    let start = Instant::now();
                    for n in 0..ROUND_TRIPS {
                        fibra::future::block_on(ask(&requests, &mut answers, n));
                    }
                    start.elapsed()
                },
                None,
            )
            .expect("submit");
        per_round_trip(client.join().expect("client fiber"))
    });
    rt::fibra_stop(sched);
    rt::tokio_stop(tokio);
    v
}

fn tokio(cfg: Cfg) -> Vec<f64> {
    let rt = rt::tokio(cfg.threads);
    let v = repeat(cfg.warmup, cfg.reps, || {
        let (requests, mut answers) = start_echo(&rt);
        let client = rt.spawn(async move {
            let start = Instant::now();
            for n in 0..ROUND_TRIPS {
                ask(&requests, &mut answers, n).await;
            }
            start.elapsed()
        });
        per_round_trip(rt.block_on(client).expect("client task"))
    });
    rt::tokio_stop(rt);
    v
}

fn per_round_trip(took: Duration) -> f64 {
    ns_per(took, ROUND_TRIPS as usize)
}
