//! `fibra::sync::OnceLock`: an initialiser that suspends its fiber does not deadlock the
//! fibers of its worker that want the value (std's `OnceLock` would block that worker).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::{finish, with_deadline};
use fibra::sync::OnceLock;
use fibra::Scheduler;

#[test]
fn a_suspending_initialiser_runs_once_while_fibers_of_its_worker_wait() {
    with_deadline(|| {
        let sched = Scheduler::builder().threads(1).build().expect("build");
        sched.start();
        let cell = Arc::new(OnceLock::new());
        let runs = Arc::new(AtomicUsize::new(0));
        let handles: Vec<_> = (0..20)
            .map(|i| {
                let (cell, runs) = (cell.clone(), runs.clone());
                sched
                    .submit(
                        move || {
                            *cell.get_or_init(|| {
                                runs.fetch_add(1, Ordering::SeqCst);
                                fibra::sleep(Duration::from_millis(20));
                                i
                            })
                        },
                        None,
                    )
                    .expect("submit")
            })
            .collect();
        let values: Vec<_> = handles.into_iter().map(finish).collect();
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        assert!(values.iter().all(|&v| v == values[0]));
        assert_eq!(cell.get(), Some(&values[0]));
        sched.stop();
    });
}

#[test]
fn a_panicking_initialiser_leaves_the_cell_empty() {
    let cell = OnceLock::new();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        cell.get_or_init(|| panic!("init fails"));
    }));
    assert!(r.is_err());
    assert_eq!(cell.get(), None::<&u8>);
    assert_eq!(cell.set(3), Ok(()));
    assert_eq!(cell.set(4), Err(4));
    assert_eq!(*cell.get_or_init(|| 5), 3);
    assert_eq!(cell.into_inner(), Some(3));
}

#[test]
fn static_cell() {
    static CELL: OnceLock<String> = OnceLock::new();
    assert_eq!(CELL.get_or_init(|| "x".to_string()), "x");
    assert_eq!(CELL.get().map(String::as_str), Some("x"));
}
