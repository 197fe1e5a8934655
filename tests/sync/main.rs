//! `fibra::sync`'s locks and meeting points between fibers and threads: `Mutex`, `RwLock`,
//! `Condvar`, `Semaphore`, `Barrier`, `WaitGroup`, `OnceLock`, and their misuse.

#[path = "../common/mod.rs"]
mod common;

mod barrier;
mod condvar;
mod misuse;
mod mutex;
mod once_lock;
mod pool;
mod rwlock;
mod semaphore;
mod waitgroup;
