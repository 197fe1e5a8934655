//! Helpers shared by the integration tests: generous deadlines so that a hung
//! scheduler fails a test instead of hanging the whole run.
#![allow(dead_code)]

use std::any::Any;
use std::io::Read;
use std::panic;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use fibra::{JoinHandle, Scheduler};

/// Long enough that a loaded 2-core machine never reaches it; short enough
/// that a hang is reported as a failure.
pub const LIMIT: Duration = Duration::from_secs(30);

/// Runs `body` on a fresh thread and fails the test if it has not returned
/// within 60 s. A panic in `body` is propagated as the test's own panic.
pub fn with_deadline(body: impl FnOnce() + Send + 'static) {
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let runner = thread::spawn(move || {
        body();
        let _ = done_tx.send(());
    });
    match done_rx.recv_timeout(2 * LIMIT) {
        Ok(()) => runner.join().expect("test body thread"),
        Err(RecvTimeoutError::Disconnected) => {
            if let Err(payload) = runner.join() {
                panic::resume_unwind(payload);
            }
        }
        Err(RecvTimeoutError::Timeout) => panic!("test body did not finish within {:?}", 2 * LIMIT),
    }
}

/// Counts its drops into the shared counter: a value the tests hand to fibra (a closure's
/// capture, a result, a message) is dropped exactly once, and when.
#[derive(Debug)]
pub struct Counted(pub Arc<AtomicUsize>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// Waits (bounded by [`LIMIT`]) for a task and returns its value.
pub fn finish<T>(handle: JoinHandle<T>) -> T {
    assert!(
        handle.wait_timeout(LIMIT),
        "task {} did not finish within {LIMIT:?}",
        handle.id()
    );
    assert!(handle.is_finished());
    handle.join().expect("task failed")
}

/// Polls `cond` every millisecond until it holds; panics after [`LIMIT`].
pub fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + LIMIT;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        thread::sleep(Duration::from_millis(1));
    }
}

/// The message of a panic payload made by `panic!("literal")` or `panic!("{}", x)`.
pub fn panic_message(payload: &(dyn Any + Send)) -> Option<String> {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
}

/// A slot where a test keeps a value handed out by a fiber (an `Unparker`).
pub type Slot<T> = std::sync::Arc<Mutex<Option<T>>>;

/// The environment variable that tells a re-run test binary which test runs its body in
/// the child (see [`in_child`]).
const CHILD_TEST: &str = "FIBRA_TEST_CHILD";

/// The line a child writes to stderr once its body has returned: a child that exits 0
/// without it ran no body (its test name did not match), which [`ChildRun::assert_ok`]
/// refuses.
const BODY_RETURNED: &str = "fibra-test-child: the body returned";

/// How a child process made by [`in_child`] ended.
pub struct ChildRun {
    /// The test whose body the child ran.
    pub test: String,
    /// Its exit status; `None` if it outlived `2 * LIMIT` and was killed.
    pub status: Option<ExitStatus>,
    /// Everything it wrote to stderr.
    pub stderr: String,
}

impl ChildRun {
    /// Whether the body returned and the child exited with status 0.
    pub fn passed(&self) -> bool {
        self.status.is_some_and(|s| s.success()) && self.stderr.contains(BODY_RETURNED)
    }

    /// The signal that ended the child, if one did.
    pub fn signal(&self) -> Option<i32> {
        use std::os::unix::process::ExitStatusExt;
        self.status.and_then(|s| s.signal())
    }

    /// The child's exit code, if it exited.
    pub fn code(&self) -> Option<i32> {
        self.status.and_then(|s| s.code())
    }

    /// The exit status; fails the test if the child hung.
    pub fn exit_status(&self) -> ExitStatus {
        match self.status {
            Some(s) => s,
            None => panic!("{}", self.explain("hung and was killed")),
        }
    }

    /// Fails the test, with `defect` and the end of the child's stderr, unless the body
    /// returned and the child exited with status 0.
    pub fn assert_ok(&self, defect: &str) {
        if self.passed() {
            return;
        }
        let how = match self.status {
            None => format!("hung and was killed after {:?}", 2 * LIMIT),
            Some(s) if s.success() => {
                "exited 0 without running its body (is in_child called on the test's own \
                 thread?)"
                    .to_string()
            }
            Some(_) if self.signal() == Some(libc::SIGABRT) => "ABORTED (SIGABRT)".to_string(),
            Some(s) => format!("failed: {s}"),
        };
        panic!("{defect}\n{}", self.explain(&how));
    }

    fn explain(&self, how: &str) -> String {
        let lines: Vec<&str> = self.stderr.lines().collect();
        let tail = lines[lines.len().saturating_sub(60)..].join("\n");
        format!(
            "the child process of `{}` {how}; the end of its stderr:\n{tail}",
            self.test
        )
    }
}

/// Runs `body` in a child process, for what the test harness's own process cannot hold: a
/// signal or abort that ends the process, process-wide settings (a panic hook, resource
/// limits, the blocking pool's keep-alive, signal handlers), counts of the whole process
/// (CPU time, threads, descriptors), or a `fork`.
///
/// The child is this test binary, re-run for this one test (`--exact`, one test thread),
/// with stdout discarded and stderr captured; it is killed if it outlives `2 * LIMIT`. In
/// the child the same test function runs again up to this call, which then runs `body`
/// and ends the process (status 0 when `body` returns; a panic fails it as a test failure
/// does). So call it first, on the test's own thread, once per test; whatever the test
/// asserts about the child comes after it and runs in the parent only.
pub fn in_child(body: impl FnOnce()) -> ChildRun {
    in_child_with(&[], body)
}

/// [`in_child`] with extra environment variables for the child. `RUST_BACKTRACE` is `0`
/// in the child unless `envs` sets it.
pub fn in_child_with(envs: &[(&str, &str)], body: impl FnOnce()) -> ChildRun {
    let test = thread::current()
        .name()
        .filter(|n| *n != "main")
        .expect("in_child runs on the test's own thread (named after the test)")
        .to_string();
    if std::env::var(CHILD_TEST).is_ok_and(|t| t == test) {
        body();
        eprintln!("{BODY_RETURNED}");
        std::process::exit(0);
    }
    let mut cmd = Command::new(std::env::current_exe().expect("current test binary"));
    cmd.args([&test, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_TEST, &test)
        .env("RUST_BACKTRACE", "0")
        .envs(envs.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn the child test process");
    let mut stderr = child.stderr.take().expect("piped stderr");
    let reader = thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = stderr.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    });
    let deadline = Instant::now() + 2 * LIMIT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the child") {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        thread::sleep(Duration::from_millis(10));
    };
    ChildRun {
        test,
        status,
        stderr: reader.join().expect("stderr reader"),
    }
}

/// Runs `body` in a child process ([`in_child`]) and fails unless it returned there.
pub fn child_ok(body: impl FnOnce()) {
    in_child(body).assert_ok("the child's body failed");
}

/// A started scheduler with `threads` workers named `name`.
pub fn named(threads: usize, name: &str) -> Scheduler {
    let s = Scheduler::builder()
        .threads(threads)
        .name(name)
        .build()
        .unwrap();
    s.start();
    s
}

/// Every worker still runs a pinned task.
pub fn every_worker_runs(sched: &Scheduler) {
    for w in 0..sched.threads() {
        let h = sched.submit(fibra::current_worker, Some(w)).unwrap();
        assert_eq!(finish(h), Some(w), "worker {w} no longer runs tasks");
    }
}

/// A task of `sched` that waits on the blocking pool until the returned sender sends, is
/// dropped, or `bound` passes, then returns `value`.
pub fn held_task<T: Send + 'static>(
    sched: &Scheduler,
    value: T,
    bound: Duration,
) -> (mpsc::Sender<()>, Arc<JoinHandle<T>>) {
    let (tx, rx) = mpsc::channel::<()>();
    let task = move || {
        let _ = fibra::unblock(move || rx.recv_timeout(bound));
        value
    };
    (tx, Arc::new(sched.submit(task, None).unwrap()))
}

/// A started scheduler with `threads` workers.
pub fn started(threads: usize) -> Scheduler {
    let sched = Scheduler::builder()
        .threads(threads)
        .build()
        .expect("a valid configuration builds");
    sched.start();
    sched
}

/// A `fibra::net` listener on 127.0.0.1 and a std client connected to it (not accepted yet).
pub fn listener_and_client() -> (fibra::net::TcpListener, std::net::TcpStream) {
    let listener = fibra::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("local_addr");
    let client = std::net::TcpStream::connect(addr).expect("connect");
    (listener, client)
}

/// Submits `n` fibers (pinned to `worker`, or anywhere), each touching `KIB` KiB of its
/// stack and then parking, so that `n` stacks are in use at once; once all have parked, calls
/// `at_peak`, then wakes and joins them all.
pub fn park_burst<const KIB: usize>(
    s: &Scheduler,
    n: usize,
    worker: Option<usize>,
    at_peak: impl FnOnce(),
) {
    let unparkers = Arc::new(Mutex::new(Vec::with_capacity(n)));
    let handles: Vec<_> = (0..n)
        .map(|_| {
            let unparkers = unparkers.clone();
            s.submit(
                move || {
                    let mut buf = [[0u8; 1024]; KIB];
                    for kib in std::hint::black_box(&mut buf).iter_mut() {
                        kib.fill(1);
                    }
                    fibra::park(|u| unparkers.lock().unwrap().push(u));
                    std::hint::black_box(&buf).first().map(|kib| kib[0])
                },
                worker,
            )
            .unwrap()
        })
        .collect();
    wait_until("the burst to park", || unparkers.lock().unwrap().len() == n);
    at_peak();
    for u in unparkers.lock().unwrap().drain(..) {
        u.unpark();
    }
    for h in handles {
        assert_eq!(finish(h), (KIB > 0).then_some(1));
    }
}

/// Lowers RLIMIT_NOFILE to 256 and opens /dev/null until EMFILE, leaving `leave` free
/// (for a child process: the limit stays lowered).
pub fn fill_descriptor_table(leave: usize) -> Vec<std::fs::File> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: valid pointer to a live struct.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
    lim.rlim_cur = lim.rlim_cur.min(256);
    // SAFETY: as above.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) }, 0);
    let mut filler = Vec::new();
    loop {
        match std::fs::File::open("/dev/null") {
            Ok(f) => filler.push(f),
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::EMFILE));
                break;
            }
        }
    }
    for _ in 0..leave {
        filler.pop();
    }
    filler
}

/// Closes `s` with an RST instead of a FIN (SO_LINGER on, with a zero timeout).
pub fn reset(s: impl std::os::fd::AsRawFd) {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: a valid socket fd and a live `linger` of the size passed.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0, "SO_LINGER: {}", std::io::Error::last_os_error());
    drop(s);
}

/// Polls `cond` every millisecond for at most `limit`; whether it came to hold.
pub fn eventually(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(1));
    }
}

/// Blocks the whole thread for `d`, inside a fiber too, and also with the `hook` feature,
/// which parks a fiber in `nanosleep` (a raw system call is not hooked).
pub fn block_thread(d: Duration) {
    let end = Instant::now() + d;
    while let Some(left) = end.checked_duration_since(Instant::now()) {
        if left.is_zero() {
            break;
        }
        let ts = libc::timespec {
            tv_sec: left.as_secs() as libc::time_t,
            tv_nsec: left.subsec_nanos() as libc::c_long,
        };
        // SAFETY: a valid timespec that outlives the call; no remainder is asked for.
        unsafe {
            libc::syscall(
                libc::SYS_nanosleep,
                &ts as *const libc::timespec,
                std::ptr::null_mut::<libc::timespec>(),
            )
        };
    }
}

/// A started scheduler with `threads` workers, shared.
pub fn shared_started(threads: usize) -> Arc<Scheduler> {
    Arc::new(started(threads))
}

/// The calling thread's `errno`.
pub fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Runs `f` in a fiber of a fresh one-worker scheduler and on a plain thread (with the
/// `hook` feature: libc's own calls on fds no fiber switched), returning (fiber, thread).
pub fn both<T: Send + 'static>(f: fn() -> T) -> (T, T) {
    let plain = thread::spawn(f).join().unwrap();
    let s = started(1);
    let fib = finish(s.submit(f, None).unwrap());
    s.stop();
    (fib, plain)
}

/// [`both`], checking the thread's result against `libc` and the fiber's against the
/// thread's.
pub fn same_as_libc<T: std::fmt::Debug + PartialEq + Send + 'static>(
    f: fn() -> T,
    libc: T,
    what: &str,
) {
    let (fib, plain) = both(f);
    assert_eq!(plain, libc, "libc's reference");
    assert_eq!(fib, plain, "fiber: {what}");
}

/// Waits until `sched`'s dump shows at least `n` of its fibers parked on I/O readiness
/// (a socket or fd wait): on several workers, no one worker's counters can tell.
pub fn parked_on_io(sched: &Scheduler, n: usize) {
    use fibra::dump::{Status, WaitOn};
    wait_until("fibers to park on I/O", || {
        sched
            .dump()
            .fibers()
            .iter()
            .filter(|e| matches!(e.status(), Status::Parked(WaitOn::Io { .. })))
            .count()
            >= n
    });
}

/// Waits until worker 0 of `sched` has parked a fiber (for one-worker schedulers: on more,
/// the fiber may have run elsewhere).
pub fn a_fiber_parked(sched: &Scheduler) {
    wait_until("a fiber to park", || {
        sched.metrics().workers()[0].parks() > 0
    });
}

/// On a one-worker `sched`: a fiber waits first in `rx.recv()`; once it waits, `between`
/// runs (more waiters join); then a fiber of the same worker sends `msg` (into the first
/// receiver's slot) and cancels that receiver, which the worker handles before the receiver
/// resumes, so it unwinds with the message in hand. Returns once the first receiver has
/// ended, cancelled, with the sender (still connected).
pub fn cancel_a_receiver_holding_a_message(
    sched: &Scheduler,
    tx: fibra::sync::mpsc::Sender<u32>,
    rx: &Arc<fibra::sync::mpsc::Receiver<u32>>,
    msg: u32,
    between: impl FnOnce(),
) -> fibra::sync::mpsc::Sender<u32> {
    let r = rx.clone();
    let first = Arc::new(sched.submit(move || r.recv().ok(), None).unwrap());
    a_fiber_parked(sched);
    between();
    let f = first.clone();
    let ender = sched
        .submit(
            move || {
                tx.send(msg).unwrap();
                f.cancel();
                tx
            },
            None,
        )
        .unwrap();
    let tx = finish(ender);
    assert!(first.wait_timeout(LIMIT));
    assert!(first.is_cancelled(), "the first receiver was cancelled");
    tx
}

/// Sets the socket timeout `opt` (`SO_RCVTIMEO` or `SO_SNDTIMEO`) of `fd` with a real call.
pub fn set_socket_timeout(fd: std::os::fd::RawFd, opt: i32, d: Duration) {
    let tv = libc::timeval {
        tv_sec: d.as_secs() as _,
        tv_usec: d.subsec_micros() as _,
    };
    // SAFETY: a live timeval of the right size.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            opt,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as _,
        )
    };
    assert_eq!(r, 0, "setsockopt");
}

/// A fiber of `s` that counts every `period` until `stop`: proof that the worker it shares
/// with a waiting call keeps running other fibers.
pub fn ticker(
    s: &Scheduler,
    stop: Arc<std::sync::atomic::AtomicBool>,
    period: Duration,
) -> (Arc<AtomicUsize>, JoinHandle<()>) {
    let ticks = Arc::new(AtomicUsize::new(0));
    let t = ticks.clone();
    let h = s
        .submit(
            move || {
                while !stop.load(Ordering::Relaxed) {
                    t.fetch_add(1, Ordering::Relaxed);
                    fibra::sleep(period);
                }
            },
            None,
        )
        .unwrap();
    (ticks, h)
}

/// Becomes `uid` (so that RLIMIT_NPROC is enforced, which it is not for root) and caps its
/// tasks at the threads of this process now plus `more` (for a child process). The limit
/// counts every task of the uid, so each child test takes a uid of its own that nothing else
/// runs as: the tests of a binary run at once.
pub fn cap_threads(uid: libc::uid_t, more: usize) {
    // SAFETY: plain calls; a failure is reported.
    unsafe {
        if libc::geteuid() == 0 {
            assert!(
                libc::setgid(uid) == 0 && libc::setuid(uid) == 0,
                "cannot become uid {uid}: {}",
                std::io::Error::last_os_error()
            );
        }
    }
    let n = (std::fs::read_dir("/proc/self/task").unwrap().count() + more) as libc::rlim_t;
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a valid out pointer.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NPROC, &mut lim) }, 0);
    // The hard limit stays, so that `uncap_threads` can raise the soft one again.
    lim.rlim_cur = n;
    // SAFETY: a valid rlimit.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NPROC, &lim) }, 0);
}

/// Raises the soft RLIMIT_NPROC back to the hard one (after [`cap_threads`]).
pub fn uncap_threads() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: valid pointers; raising a soft limit up to the hard one needs no privilege.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NPROC, &mut lim), 0);
        lim.rlim_cur = lim.rlim_max;
        assert_eq!(libc::setrlimit(libc::RLIMIT_NPROC, &lim), 0);
    }
}

/// Installs `handler` for `sig`, with `SA_RESTART` or without, and an empty mask.
pub fn install_signal(sig: i32, restart: bool, handler: extern "C" fn(libc::c_int)) {
    // SAFETY: installing a handler with an empty mask.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = handler as *const () as usize;
        sa.sa_flags = if restart { libc::SA_RESTART } else { 0 };
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(sig, &sa, std::ptr::null_mut()), 0);
    }
}

/// The calling thread's kernel id.
pub fn gettid() -> i32 {
    // SAFETY: no arguments.
    unsafe { libc::syscall(libc::SYS_gettid) as i32 }
}

/// Sends `sig` to thread `tid` of this process.
pub fn tgkill(tid: i32, sig: i32) {
    // SAFETY: signalling a thread of our own process with a handled signal.
    unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), tid, sig) };
}

/// Sends `sig` to every other thread of this process.
pub fn signal_other_threads(sig: i32) {
    let me = gettid();
    if let Ok(dir) = std::fs::read_dir("/proc/self/task") {
        for e in dir.flatten() {
            if let Ok(tid) = e.file_name().to_string_lossy().parse::<i32>() {
                if tid != me {
                    tgkill(tid, sig);
                }
            }
        }
    }
}

/// A page mapped with no access (never unmapped): a pointer no call may read or write.
pub fn unmapped_page() -> *mut libc::c_void {
    // SAFETY: a fresh anonymous mapping, never accessed.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    p
}

/// In a child process: ends the process with `msg` on stderr (exit code 3) unless the
/// returned flag is set within `after`, so that a hang becomes a clear failure.
pub fn child_watchdog(after: Duration, msg: &'static str) -> Arc<std::sync::atomic::AtomicBool> {
    let disarm = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let d = disarm.clone();
    thread::spawn(move || {
        let end = Instant::now() + after;
        while Instant::now() < end {
            if d.load(Ordering::SeqCst) {
                return;
            }
            thread::sleep(Duration::from_millis(10));
        }
        eprintln!("{msg}");
        // SAFETY: ends the process at once.
        unsafe { libc::_exit(3) };
    });
    disarm
}

/// `connect(2)` of the raw socket `fd` to the IPv4 `addr`, without making a descriptor (for
/// tests that fill the descriptor table first); returns the call's result.
pub fn raw_connect(fd: std::os::fd::RawFd, addr: std::net::SocketAddr) -> i32 {
    let std::net::SocketAddr::V4(a) = addr else {
        panic!("raw_connect takes IPv4 addresses");
    };
    let sa = libc::sockaddr_in {
        sin_family: libc::AF_INET as u16,
        sin_port: a.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*a.ip()).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: a valid sockaddr_in that lives across the call; a bad `fd` is an error.
    unsafe {
        libc::connect(
            fd,
            (&sa as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as u32,
        )
    }
}

// ------------------------------------------------------------------ forked children

/// The threads' backtraces of process `pid`, fibra's frames and their neighbours only.
pub fn backtrace(pid: libc::pid_t) -> String {
    let out = std::process::Command::new("gdb")
        .args([
            "-p",
            &pid.to_string(),
            "-batch",
            "-ex",
            "thread apply all bt",
        ])
        .stdin(std::process::Stdio::null())
        .output();
    match out {
        Ok(o) => String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter(|l| {
                l.starts_with("Thread")
                    || l.starts_with("#0 ")
                    || (l.starts_with('#')
                        && (l.contains(" fibra::")
                            || l.contains(concat!(" ", env!("CARGO_CRATE_NAME"), "::")))
                        && !l.contains("{closure"))
            })
            .map(|l| l.chars().take(160).collect::<String>())
            .collect::<Vec<_>>()
            .join("\n"),
        Err(e) => format!("(no gdb: {e})"),
    }
}

/// Waits for `pid` for at most `limit`; returns its wait status, or prints its backtraces,
/// kills it and returns `None`.
pub fn wait_child(pid: libc::pid_t, limit: Duration) -> Option<i32> {
    let end = Instant::now() + limit;
    loop {
        let mut status = 0;
        // SAFETY: waiting for our own child.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            return Some(status);
        }
        if Instant::now() > end {
            eprintln!(
                "--- forked child {pid} hung; its threads:\n{}",
                backtrace(pid)
            );
            // SAFETY: killing and reaping our own child.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            return None;
        }
        thread::sleep(Duration::from_millis(5));
    }
}

/// How a forked child ended, in words.
pub fn describe(st: Option<i32>) -> String {
    match st {
        None => "hung (killed)".to_string(),
        Some(st) if libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0 => "ok".to_string(),
        Some(st) if libc::WIFEXITED(st) => format!("exit {}", libc::WEXITSTATUS(st)),
        Some(st) if libc::WIFSIGNALED(st) => format!("signal {}", libc::WTERMSIG(st)),
        Some(st) => format!("status {st:#x}"),
    }
}

/// In a forked child: runs `body`, then ends the process (0 if it returned).
pub fn child_runs(body: impl FnOnce()) -> ! {
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body));
    // SAFETY: ends the child without running the parent's atexit handlers.
    unsafe { libc::_exit(if r.is_ok() { 0 } else { 1 }) }
}

/// Forks; the child runs `body` and exits 0 if it returns; the parent reports how it ended.
pub fn fork_and(limit: Duration, body: fn()) -> String {
    // SAFETY: the child only runs `body` and exits.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork");
    if pid == 0 {
        child_runs(body);
    }
    describe(wait_child(pid, limit))
}
