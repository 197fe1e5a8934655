//! Stack overflow is reported, not silent memory corruption: a fiber that runs
//! off its stack aborts the process with a message naming the fiber, its
//! worker and its stack size, and an ordinary thread that overflows still gets
//! std's own message. Each overflow happens in a child process: the test binary
//! re-runs itself with `FIBRA_OVERFLOW_CHILD` set and a filter naming one of
//! the ignored helper tests below.

use std::env;
use std::hint::black_box;
use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use fibra::Scheduler;

const CHILD_ENV: &str = "FIBRA_OVERFLOW_CHILD";
const SIGABRT: i32 = 6;
const CHILD_LIMIT: Duration = Duration::from_secs(60);

/// Recurses without bound, 4 KiB of live locals per frame.
fn recurse(depth: u64) -> u64 {
    let frame = black_box([depth as u8; 4096]);
    if black_box(depth) == u64::MAX {
        return 0;
    }
    recurse(depth + 1).wrapping_add(u64::from(frame[(depth % 4096) as usize]))
}

/// True when this process is the child asked to run `mode`.
fn is_child(mode: &str) -> bool {
    env::var(CHILD_ENV).is_ok_and(|m| m == mode)
}

/// Runs the ignored helper test `helper` in a child process; returns how the
/// child ended and what it wrote to stderr.
fn run_child(helper: &str) -> (ExitStatus, String) {
    let mut child = Command::new(env::current_exe().expect("current test binary"))
        .args([helper, "--ignored", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, helper)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the child test process");
    let mut stderr = child.stderr.take().expect("piped stderr");
    let reader = thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = stderr.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    });
    let deadline = Instant::now() + CHILD_LIMIT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the child") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the child {helper} did not end within {CHILD_LIMIT:?}");
        }
        thread::sleep(Duration::from_millis(10));
    };
    (status, reader.join().expect("stderr reader"))
}

fn overflow_a_fiber(stack_size: Option<usize>, threads: usize, worker: usize) {
    let mut builder = Scheduler::builder().threads(threads);
    if let Some(bytes) = stack_size {
        builder = builder.stack_size(bytes);
    }
    let sched = builder.build().expect("build");
    sched.start();
    let handle = sched.submit(|| recurse(0), Some(worker)).expect("submit");
    // Only reached if the overflow did not abort the process.
    let outcome = handle.wait_timeout(CHILD_LIMIT);
    eprintln!("child survived the overflow: finished = {outcome}");
}

#[test]
#[ignore = "child process of fiber_overflow_aborts_naming_the_fiber"]
fn child_overflows_a_fiber_on_worker_0() {
    if is_child("child_overflows_a_fiber_on_worker_0") {
        overflow_a_fiber(None, 1, 0);
    }
}

#[test]
#[ignore = "child process of fiber_overflow_message_gives_worker_and_stack_size"]
fn child_overflows_a_512_kib_fiber_on_worker_1() {
    if is_child("child_overflows_a_512_kib_fiber_on_worker_1") {
        overflow_a_fiber(Some(512 * 1024), 2, 1);
    }
}

#[test]
#[ignore = "child process of thread_overflow_still_gets_std_message"]
fn child_overflows_a_plain_thread() {
    if is_child("child_overflows_a_plain_thread") {
        // Run a fiber first so that fibra's overflow handling is installed.
        let sched = Scheduler::builder().threads(1).build().expect("build");
        assert_eq!(sched.block_on(|| recurse_a_little(8)), 8);
        let plain = thread::Builder::new()
            .name("plain-overflow".into())
            .spawn(|| recurse(0))
            .expect("spawn");
        let outcome = plain.join();
        eprintln!("child survived the overflow: {}", outcome.is_ok());
    }
}

fn recurse_a_little(depth: u64) -> u64 {
    if depth == 0 {
        0
    } else {
        1 + recurse_a_little(black_box(depth - 1))
    }
}

#[test]
fn fiber_overflow_aborts_naming_the_fiber() {
    let (status, stderr) = run_child("child_overflows_a_fiber_on_worker_0");
    assert_eq!(
        status.signal(),
        Some(SIGABRT),
        "status {status}, stderr:\n{stderr}"
    );
    assert!(stderr.contains("fiber"), "stderr:\n{stderr}");
    assert!(stderr.contains("overflowed its"), "stderr:\n{stderr}");
    assert!(
        stderr.contains("fiber '<unnamed>' (#"),
        "an unnamed task is called '<unnamed>', stderr:\n{stderr}"
    );
    assert!(
        stderr.contains(") on worker 0 overflowed its 256 KiB stack"),
        "stderr:\n{stderr}"
    );
}

#[test]
fn fiber_overflow_message_gives_worker_and_stack_size() {
    let (status, stderr) = run_child("child_overflows_a_512_kib_fiber_on_worker_1");
    assert_eq!(
        status.signal(),
        Some(SIGABRT),
        "status {status}, stderr:\n{stderr}"
    );
    assert!(
        stderr.contains("on worker 1 overflowed its 512 KiB stack"),
        "stderr:\n{stderr}"
    );
}

#[test]
fn thread_overflow_still_gets_std_message() {
    let (status, stderr) = run_child("child_overflows_a_plain_thread");
    assert_eq!(
        status.signal(),
        Some(SIGABRT),
        "status {status}, stderr:\n{stderr}"
    );
    assert!(
        // std names the thread and, since Rust 1.89, its numeric id:
        // "thread 'plain-overflow' (1234) has overflowed its stack".
        stderr.contains("thread 'plain-overflow'") && stderr.contains("has overflowed its stack"),
        "stderr:\n{stderr}"
    );
    assert!(
        !stderr.contains("fiber '"),
        "a thread's overflow is not blamed on a fiber, stderr:\n{stderr}"
    );
}
