//! A per-worker cache without a lock: each worker keeps an `Rc<RefCell<HashMap>>` that its
//! own fibers share, which only a runtime whose fibers never change thread can offer
//! safely. `fibra::spawn_local` takes `!Send` closures; `fibra::fiber_local!` gives each
//! fiber its own counters.
//!
//! ```sh
//! cargo run --release --example local_cache
//! ```
//!
//! Requests for 64 keys arrive on a channel shared by all workers. On each worker a
//! dispatcher fiber takes requests and serves each in a local fiber of its own, which looks
//! the key up in that worker's cache and, on a miss, "fetches" it (a 2 ms sleep standing for
//! a backend call) and stores it. Prints each worker's hits and misses, and checks every
//! answer.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

use fibra::sync::mpmc;

const WORKERS: usize = 2;
const KEYS: u64 = 64;
const REQUESTS: u64 = 20_000;

/// A worker's cache: shared by its fibers through `Rc`, mutated through `RefCell`, never
/// borrowed across a suspension.
type Cache = Rc<RefCell<HashMap<u64, Rc<str>>>>;

fibra::fiber_local! {
    /// Requests a fiber has served (each request's fiber serves one: always 0 or 1 here).
    static SERVED: Cell<u32> = Cell::new(0);
}

/// The value of `key`, as a backend would answer it.
fn fetch(key: u64) -> Rc<str> {
    fibra::sleep(Duration::from_millis(2));
    Rc::from(format!("value-{key}"))
}

/// One request: the value from the cache, or fetched and stored. Returns whether it hit.
fn serve(cache: &Cache, key: u64) -> bool {
    SERVED.with(|s| s.set(s.get() + 1));
    // The borrow ends before the fetch, which suspends this fiber.
    let cached = cache.borrow().get(&key).cloned();
    let (value, hit) = match cached {
        Some(v) => (v, true),
        None => {
            let v = fetch(key);
            cache.borrow_mut().entry(key).or_insert(v.clone());
            (v, false)
        }
    };
    assert_eq!(&*value, format!("value-{key}"));
    assert_eq!(SERVED.with(Cell::get), 1);
    hit
}

fn main() {
    let sched = fibra::Scheduler::builder()
        .threads(WORKERS)
        .build()
        .expect("scheduler");
    sched.start();
    let (tx, rx) = mpmc::channel::<u64>();
    // One dispatcher pinned to each worker: its cache lives and dies there.
    let dispatchers: Vec<_> = (0..WORKERS)
        .map(|w| {
            let rx = rx.clone();
            sched
                .submit(
                    move || {
                        let cache: Cache = Rc::new(RefCell::new(HashMap::new()));
                        let (hits, misses) = (Rc::new(Cell::new(0)), Rc::new(Cell::new(0)));
                        let mut served = Vec::new();
                        while let Ok(key) = rx.recv() {
                            let (cache, hits, misses) =
                                (cache.clone(), hits.clone(), misses.clone());
                            served.push(fibra::spawn_local(move || {
                                let counter = if serve(&cache, key) { hits } else { misses };
                                counter.set(counter.get() + 1);
                            }));
                            if served.len() >= 256 {
                                served.drain(..).for_each(|h| h.join().unwrap());
                            }
                        }
                        served.into_iter().for_each(|h| h.join().unwrap());
                        let cached = cache.borrow().len();
                        (w, hits.get(), misses.get(), cached)
                    },
                    Some(w),
                )
                .expect("submit")
        })
        .collect();
    drop(rx);
    sched.block_on(move || {
        for i in 0..REQUESTS {
            tx.send(i * 7919 % KEYS).expect("dispatchers alive");
        }
    });
    let mut total = 0;
    for d in dispatchers {
        let (w, hits, misses, cached) = d.join().expect("dispatcher");
        println!("worker {w}: {hits} hits, {misses} misses, {cached} keys cached");
        assert!(cached as u64 <= KEYS && misses >= cached as u64);
        total += hits + misses;
    }
    assert_eq!(total, REQUESTS);
    sched.stop();
}
