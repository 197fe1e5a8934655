//! [`OnceLock`]: a cell written once, whose initialiser may suspend.
//!
//! Why not `std::sync::OnceLock`? While one caller runs the initialiser, std blocks the
//! other callers' *threads*. If the initialiser suspends its fiber (it sleeps, receives,
//! connects a socket) and another fiber of the same worker asks for the value, that worker
//! blocks inside std and can never resume the initialiser: a deadlock. Here the callers
//! queue on a fibra [`Mutex`] instead, in arrival order, and the value itself lives in a
//! `std::sync::OnceLock` that is only ever written under that mutex, so std never waits.

use super::mutex::Mutex;
use std::fmt;
use std::sync::PoisonError;

/// A thread- and fiber-safe cell written at most once, like [`std::sync::OnceLock`], whose
/// initialiser may suspend the fiber running it.
///
/// ```
/// use fibra::sync::OnceLock;
/// use std::sync::Arc;
/// use std::time::Duration;
///
/// let sched = fibra::Scheduler::builder().threads(1).build()?;
/// sched.start();
/// let config = Arc::new(OnceLock::new());
/// let tasks: Vec<_> = (0..5)
///     .map(|_| {
///         let config = config.clone();
///         sched.submit(move || {
///             *config.get_or_init(|| {
///                 fibra::sleep(Duration::from_millis(5)); // e.g. fetch it; others wait
///                 42
///             })
///         }, None).unwrap()
///     })
///     .collect();
/// for t in tasks {
///     assert_eq!(t.join().unwrap(), 42);
/// }
/// sched.stop();
/// # Ok::<(), fibra::Error>(())
/// ```
pub struct OnceLock<T> {
    value: std::sync::OnceLock<T>,
    /// Held by the one caller running an initialiser.
    init: Mutex<()>,
}

impl<T> OnceLock<T> {
    const_unless_loom! {
        /// An empty cell. `const`, so it can be a `static`.
        pub fn new() -> OnceLock<T> {
            OnceLock {
                value: std::sync::OnceLock::new(),
                init: Mutex::new(()),
            }
        }
    }

    /// The value, if it has been set; never waits.
    pub fn get(&self) -> Option<&T> {
        self.value.get()
    }

    /// The value, through `&mut self`.
    pub fn get_mut(&mut self) -> Option<&mut T> {
        self.value.get_mut()
    }

    /// Sets the value if the cell is empty, waiting for an initialiser that is running;
    /// otherwise gives `value` back.
    ///
    /// # Errors
    /// `Err(value)` if the cell was already set.
    pub fn set(&self, value: T) -> Result<(), T> {
        let mut value = Some(value);
        self.get_or_init(|| value.take().expect("taken once"));
        match value {
            None => Ok(()),
            Some(v) => Err(v),
        }
    }

    /// The value, running `f` to set it first if the cell is empty. Concurrent callers
    /// wait (a fiber suspends, a thread blocks) for the one running `f`, and are served in
    /// arrival order. If `f` panics, the cell stays empty and the next caller runs its own.
    pub fn get_or_init(&self, f: impl FnOnce() -> T) -> &T {
        if let Some(v) = self.value.get() {
            return v;
        }
        // A panic in an earlier initialiser only poisons the mutex; the cell is still empty
        // and consistent, so poisoning is ignored.
        let _init = self.init.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(v) = self.value.get() {
            return v;
        }
        // Only written under `init`, so std's own once-waiting never happens.
        let _ = self.value.set(f());
        self.value.get().expect("just set")
    }

    /// Consumes the cell and returns its value, if set.
    pub fn into_inner(self) -> Option<T> {
        self.value.into_inner()
    }

    /// Empties the cell (through `&mut self`) and returns its value, if set.
    pub fn take(&mut self) -> Option<T> {
        self.value.take()
    }
}

impl<T> Default for OnceLock<T> {
    fn default() -> OnceLock<T> {
        OnceLock::new()
    }
}

impl<T: fmt::Debug> fmt::Debug for OnceLock<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_tuple("OnceLock");
        match self.get() {
            Some(v) => d.field(v),
            None => d.field(&format_args!("<uninit>")),
        };
        d.finish()
    }
}

impl<T> From<T> for OnceLock<T> {
    fn from(value: T) -> OnceLock<T> {
        let cell = OnceLock::new();
        let _ = cell.set(value);
        cell
    }
}
