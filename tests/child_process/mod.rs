//! Runs one ignored helper test of the current test binary in a child process, for tests whose
//! subject is process-wide (the panic hook) or may abort the process (a stack overflow).
//!
//! The parent re-runs its own binary with `--exact <helper> --ignored --nocapture` and
//! `CHILD_ENV=<helper>`; the helper is `#[ignore = "child process of <parent>"]` and returns at
//! once unless [`is_child`] says it was asked to run.
#![allow(dead_code)]

use std::env;
use std::io::Read;
use std::process::{Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// Names the helper a child process is asked to run.
pub const CHILD_ENV: &str = "FIBRA_TEST_CHILD";

/// How long a child may run before the parent kills it and fails.
pub const CHILD_LIMIT: Duration = Duration::from_secs(60);

/// True when this process is the child asked to run `helper`.
pub fn is_child(helper: &str) -> bool {
    env::var(CHILD_ENV).is_ok_and(|h| h == helper)
}

/// Runs the ignored helper test `helper` in a child process with the extra environment `envs`;
/// returns how the child ended and what it wrote to stderr. Fails (kills the child) if it
/// runs longer than [`CHILD_LIMIT`].
pub fn run_child(helper: &str, envs: &[(&str, &str)]) -> (ExitStatus, String) {
    let mut cmd = Command::new(env::current_exe().expect("current test binary"));
    cmd.args([
        helper,
        "--exact",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(CHILD_ENV, helper)
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn the child test process");
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
