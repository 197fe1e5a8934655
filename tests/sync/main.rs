//! `fibra::sync`'s locks and meeting points between fibers and threads: `Mutex`, `RwLock`,
//! `Condvar`, `Semaphore`, `Barrier`, `WaitGroup`, `OnceLock`, `Pool`, their misuse, and property
//! tests against sequential models.

#[path = "../common/mod.rs"]
mod common;
#[path = "../common/props.rs"]
mod props_common;

mod barrier;
mod condvar;
mod misuse;
mod mutex;
mod once_lock;
mod pool;
mod props;
mod rwlock;
mod semaphore;
mod waitgroup;
