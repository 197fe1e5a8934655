//! The blocking pool and the files on it: `unblock` (only the fiber waits), the pool's
//! growth, idling, keep-alive and wake choice, and `fibra::fs`.

#[path = "../common/mod.rs"]
mod common;

mod fs;
mod fs_edge_cases;
mod pool_growth;
mod pool_idle;
mod pool_keep_alive;
mod pool_wake;
mod unblock;
