//! fibra with the crates its users bring: tokio-based futures (axum, reqwest) in fibers,
//! blocking clients (ureq, the sync `redis` crate) under the `hook` feature, and `tracing`
//! with a real subscriber. Each module needs a feature of this package (`tokio`, `hook`,
//! `tracing`, `redis-tests`) and is empty without it.

#[path = "../../../common/mod.rs"]
mod common;

mod blocking_clients;
#[cfg(feature = "redis-tests")]
mod redis_manager;
mod redis_server;
mod tokio_futures;
mod tracing_events;
