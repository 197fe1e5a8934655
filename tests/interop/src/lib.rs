//! Tests and examples of fibra with the crates its users bring along: async code that
//! needs tokio (reqwest, axum) in fibers, blocking clients (ureq, the sync `redis` crate)
//! under the `hook` feature, and `tracing` with a real subscriber. They live in a package
//! of their own so that building fibra's own tests and examples compiles none of those
//! crates. Run with `cargo test -p fibra-interop --features tokio,tracing` and
//! `cargo test -p fibra-interop --features hook` (add `redis-tests` with a `redis-server`
//! on the PATH).
