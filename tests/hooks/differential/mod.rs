//! Differential runs of the hooks: a program of calls on fresh descriptors runs three ways —
//! with the C library's own functions on a plain thread (the reference), with the hooks on a
//! plain thread (where they pass through), and with the hooks in a fiber (where they park it)
//! — and every step's result, `errno`, buffers and flags must match the reference's.
//!
//! The fuzz targets in `fuzz/` include this module by path and feed it the fuzzer's bytes;
//! `tests/hooks/fuzz_corpus.rs` replays the committed corpus through it. See
//! `docs/hooks.md` ("Differential fuzzing").

#![allow(dead_code)]

pub mod calls;
pub mod exec;
pub mod fds;
pub mod program;

use exec::{Env, Run, Side, Step};
pub use program::{Program, Target};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, OnceLock};

/// The scheduler the fiber side runs on: one worker (so that no second worker makes its own
/// epoll instance in the middle of a program and shifts the fd numbers), made once, warmed
/// up so that the reactor's descriptors exist before any program runs.
fn scheduler() -> &'static fibra::Scheduler {
    static SCHED: OnceLock<fibra::Scheduler> = OnceLock::new();
    SCHED.get_or_init(|| {
        // Writes to a closed pipe or socket fail with EPIPE instead of killing the process
        // (a fuzz target's `main` is libFuzzer's, which leaves SIGPIPE as it found it).
        // SAFETY: setting a signal's disposition to ignore.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
        // No watchdog: a fiber that sleeps in a plain-thread call (the reference side's
        // waits) makes it read /proc to say what the thread does, and the fd it opens for
        // that lands in the program's range, where the end-of-program scan met it open.
        let s = fibra::Scheduler::builder()
            .threads(1)
            .watchdog(std::time::Duration::ZERO)
            .build()
            .expect("harness: scheduler");
        s.start();
        let warm = s
            .submit(
                || {
                    assert!(fibra::hook::is_active());
                    let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
                    a.set_read_timeout(Some(std::time::Duration::from_millis(1)))
                        .unwrap();
                    let mut buf = [0u8; 1];
                    let _ = std::io::Read::read(&mut &a, &mut buf);
                    let mut p = libc::pollfd {
                        fd: std::os::fd::AsRawFd::as_raw_fd(&a),
                        events: libc::POLLIN,
                        revents: 0,
                    };
                    // SAFETY: one live pollfd.
                    unsafe { libc::poll(&mut p, 1, 1) };
                },
                None,
            )
            .expect("harness: submit");
        assert!(warm.wait_timeout(fds::LIMIT), "harness: warm-up hangs");
        warm.join().expect("harness: warm-up");
        s
    })
}

/// Runs `prog` on a side in a thread or fiber, bounded by [`fds::LIMIT`]. A side that does
/// not finish is reported with the operation it was in.
fn run_side(side: Side, prog: &Arc<Program>, reference: Option<&Arc<Run>>) -> Result<Run, String> {
    let progress = Arc::new(AtomicUsize::new(0));
    let job = {
        let (prog, reference, progress) = (prog.clone(), reference.cloned(), progress.clone());
        move || {
            let c = if side == Side::Real {
                calls::real()
            } else {
                &calls::HOOKED
            };
            assert_eq!(
                fibra::hook::is_active(),
                side == Side::Fiber,
                "harness: hooks on the wrong side"
            );
            Env::new(c, reference.as_deref(), &progress).run(&prog)
        }
    };
    let done = if side == Side::Fiber {
        let h = scheduler()
            .submit(job, None)
            .map_err(|_| "harness: submit".to_string())?;
        if h.wait_timeout(fds::LIMIT) {
            Some(
                h.join()
                    .map_err(|e| format!("the fiber side failed: {e:?}")),
            )
        } else {
            None
        }
    } else {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
            let _ = tx.send(r);
        });
        rx.recv_timeout(fds::LIMIT)
            .ok()
            .map(|r| r.map_err(|p| format!("the {side:?} side panicked: {:?}", panic_text(&*p))))
    };
    match done {
        Some(r) => r,
        None => {
            let at = progress.load(Ordering::Relaxed);
            let op = prog
                .ops
                .get(at)
                .map(|o| format!("{o:?}"))
                .unwrap_or_default();
            Err(format!(
                "the {side:?} side hangs (over {:?}) at op #{at}: {op}\n{}",
                fds::LIMIT,
                describe(prog, reference.map(|r| &**r))
            ))
        }
    }
}

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_default()
}

/// The program and the reference's steps, for a report.
fn describe(prog: &Program, reference: Option<&Run>) -> String {
    let mut s = format!("pairs: {:?}\n", prog.pairs);
    for (i, op) in prog.ops.iter().enumerate() {
        s += &format!("  #{i}: {op:?}\n");
        if let Some(step) = reference.and_then(|r| r.steps.get(i)) {
            s += &format!("      libc: {step:?}\n");
        }
    }
    s
}

/// Compares a side's run with the reference's.
fn compare(side: Side, prog: &Program, real: &Run, got: &Run) -> Result<(), String> {
    if let Some(i) = got.diverged {
        let theirs = got
            .steps
            .get(i)
            .map(|s| format!("{s:?}"))
            .unwrap_or_default();
        return Err(format!(
            "{side:?} side differs from libc at op #{i}: {:?}\n  libc:  {:?}\n  {side:?}: {theirs}\n{}",
            prog.ops[i],
            real.steps[i],
            describe(prog, Some(real))
        ));
    }
    if got.digest != real.digest {
        let at = got
            .digest
            .iter()
            .zip(&real.digest)
            .position(|(a, b)| a != b)
            .unwrap_or(got.digest.len().min(real.digest.len()));
        return Err(format!(
            "{side:?} side's descriptors differ from libc's after the program (entry {at}):\n  libc:  {:?}\n  {side:?}: {:?}\n{}",
            real.digest.get(at),
            got.digest.get(at),
            describe(prog, Some(real))
        ));
    }
    Ok(())
}

/// Runs the program `data` decodes to for `target` on every side; `Err` describes the first
/// difference from the C library (or a side that hangs), `Ok` says how many operations the
/// reference made and how many it skipped (they could wait for ever).
pub fn check(target: Target, data: &[u8]) -> Result<(usize, usize), String> {
    scheduler();
    let prog = Arc::new(Program::decode(target, data));
    let real = Arc::new(run_side(Side::Real, &prog, None)?);
    for side in [Side::Plain, Side::Fiber] {
        let got = run_side(side, &prog, Some(&real))?;
        compare(side, &prog, &real, &got)?;
    }
    let skipped = real
        .steps
        .iter()
        .filter(|s| matches!(s, Step::Skipped(_)))
        .count();
    Ok((real.steps.len() - skipped, skipped))
}
