//! redis_get: Redis GET throughput. [`CONNECTIONS`] tasks, each with its own connection to the
//! same `redis-server` (started by the parent, see `crate::driver`), each do [`GETS`] GETs of
//! a key SET beforehand and check every value. The connections are opened before the warm-up
//! and kept for every repetition, so a repetition times the GETs only. Figure: ns per GET
//! (wall time of a repetition / all its GETs), so fibra/tokio below 1.00 means more GETs/s.
//!
//! fibra: the synchronous `redis` crate (`redis::Connection`) in fibra fibers with the `hook`
//! feature, so that its blocking socket calls park only the fiber. Hooks are compiled into
//! everything a binary links, tokio's system calls included, so fibra's side is a separate
//! program, `tests/interop/examples/redis_load.rs` (package `fibra-interop`), which the parent builds with
//! `--features hook` and passes `--connections` and `--gets` from here.
//!
//! tokio: the async `redis` crate (`tokio-comp`): one `MultiplexedConnection` per task on a
//! multi-thread runtime with the same number of workers. Its 500 ms default response timeout
//! is turned off, as the blocking client has none.

use std::time::Instant;

use redis::AsyncCommands;

use super::{Cfg, Peer};
use crate::measure::{ns_per, repeat};
use crate::rt;

/// Connections, one per task.
pub const CONNECTIONS: usize = 50;
/// GETs per connection and repetition.
pub const GETS: usize = 2_000;
/// The key every GET reads; `tests/interop/examples/redis_load.rs` uses the same key and value.
const KEY: &str = "fibra-compare:redis_get";
const VALUE: &str = "the value of fibra-compare's redis_get key";

pub fn run(peer: Peer, cfg: Cfg) -> Result<Vec<f64>, String> {
    match peer {
        Peer::Tokio => Ok(tokio(cfg)),
        // fibra's side is tests/interop/examples/redis_load (see the module docs).
        Peer::Fibra | Peer::FibraNet | Peer::May | Peer::Go | Peer::Std => {
            Err("not run in-process".into())
        }
    }
}

fn tokio(cfg: Cfg) -> Vec<f64> {
    let port = cfg.port.expect("redis_get needs the server's --port");
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).expect("redis URL");
    let config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
    let rt = rt::tokio(cfg.threads);
    let conns = rt.block_on(async {
        let mut opening = tokio::task::JoinSet::new();
        for _ in 0..CONNECTIONS {
            let (client, config) = (client.clone(), config.clone());
            opening.spawn(async move {
                client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await
                    .expect("connect to redis-server")
            });
        }
        let conns = opening.join_all().await;
        let () = conns[0].clone().set(KEY, VALUE).await.expect("SET");
        conns
    });
    let v = repeat(cfg.warmup, cfg.reps, || {
        let start = Instant::now();
        rt.block_on(async {
            let mut tasks = tokio::task::JoinSet::new();
            for conn in &conns {
                let mut conn = conn.clone();
                tasks.spawn(async move {
                    for _ in 0..GETS {
                        let v: String = conn.get(KEY).await.expect("GET");
                        assert_eq!(v, VALUE, "GET {KEY} returned another value");
                    }
                });
            }
            tasks.join_all().await;
        });
        ns_per(start.elapsed(), CONNECTIONS * GETS)
    });
    drop(conns);
    rt::tokio_stop(rt);
    v
}
