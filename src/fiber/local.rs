//! Fiber-local storage: [`fiber_local!`](crate::fiber_local) statics whose value is per
//! fiber of a scheduler, as `thread_local!`'s is per thread.
//!
//! A fiber keeps its values in its [`FiberMeta`] (`locals`), keyed by the address of their
//! static, each in a box of its own so that a value stays put while more are added. Only
//! the fiber itself touches them, on its home thread (a started fiber never changes
//! thread), so a value may be `!Send` (`Rc`, `RefCell`). They are dropped inside the
//! fiber when its task's body ends, however it ends (see [`end_of_fiber`]). Outside a
//! scheduled fiber — on a plain thread, in a standalone [`Fiber`](crate::Fiber) — the
//! values are per thread, in a thread-local table of the same kind.

use super::{current_meta, FiberMeta};
use std::any::Any;
use std::cell::UnsafeCell;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// A static whose value is per fiber; made by [`fiber_local!`](crate::fiber_local).
///
/// Each fiber of a scheduler gets its own value, made by the initialiser the first time
/// the fiber asks for it ([`with`](FiberLocal::with)), and dropped inside the fiber when
/// its task ends: when it returns, panics, or is cancelled. A value is reached only from its
/// own fiber, which never changes thread, so `T` need not be `Send` or `Sync`. On a plain
/// thread, or in a standalone [`Fiber`](crate::Fiber), the value is per thread, dropped
/// when the thread exits.
///
/// A destructor that reaches a fiber-local of its own fiber gets a fresh value, which is
/// dropped in turn (a few rounds, then what is left is leaked); a destructor that panics
/// fails the task with that panic, if it had not failed already.
pub struct FiberLocal<T: 'static> {
    init: fn() -> T,
}

impl<T: 'static> FiberLocal<T> {
    /// A fiber-local made by `init`. Use [`fiber_local!`](crate::fiber_local).
    #[doc(hidden)]
    pub const fn new(init: fn() -> T) -> Self {
        FiberLocal { init }
    }

    /// Runs `f` with the running fiber's value, made first if the fiber has none yet.
    ///
    /// ```
    /// use std::cell::Cell;
    /// fibra::fiber_local! {
    ///     static CALLS: Cell<u32> = Cell::new(0);
    /// }
    /// let sched = fibra::Scheduler::builder().threads(1).build().unwrap();
    /// let counts = sched.block_on(|| {
    ///     let other = fibra::spawn(|| CALLS.with(|c| { c.set(c.get() + 10); c.get() }));
    ///     CALLS.with(|c| c.set(c.get() + 1));
    ///     (CALLS.with(Cell::get), other.join().unwrap())
    /// });
    /// assert_eq!(counts, (1, 10));
    /// ```
    pub fn with<R>(&'static self, f: impl FnOnce(&T) -> R) -> R {
        let key = self as *const Self as usize;
        let value = match current_meta().filter(|m| m.worker.is_some()) {
            Some(meta) => meta.locals.get_or_init(key, self.init),
            None => THREAD
                .try_with(|locals| locals.0.get_or_init(key, self.init))
                .expect("a fiber-local reached while its thread exits"),
        };
        // SAFETY: the value is boxed and stays in its table until the fiber's task ends or
        // the thread exits, neither of which can happen while `f` runs on it; only code of
        // this fiber (or thread) reaches the table, and it hands out shared references only.
        f(unsafe { &*value })
    }
}

impl<T: 'static> std::fmt::Debug for FiberLocal<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FiberLocal { .. }")
    }
}

/// Declares [`FiberLocal`] statics, in `thread_local!`'s shape: each fiber of a scheduler
/// has its own value, made lazily by the initialiser.
///
/// ```
/// use std::cell::RefCell;
/// fibra::fiber_local! {
///     /// The requests this fiber has served.
///     static SERVED: RefCell<Vec<u32>> = RefCell::new(Vec::new());
///     pub static DEPTH: std::cell::Cell<usize> = std::cell::Cell::new(0);
/// }
/// let sched = fibra::Scheduler::builder().threads(2).build().unwrap();
/// let lens = sched.block_on(|| {
///     let fibers: Vec<_> = (0..4)
///         .map(|i| fibra::spawn(move || {
///             for r in 0..i {
///                 SERVED.with(|s| s.borrow_mut().push(r));
///                 fibra::Fiber::yield_now();
///             }
///             SERVED.with(|s| s.borrow().len())
///         }))
///         .collect();
///     fibers.into_iter().map(|h| h.join().unwrap()).collect::<Vec<_>>()
/// });
/// assert_eq!(lens, [0, 1, 2, 3]);
/// ```
#[macro_export]
macro_rules! fiber_local {
    () => {};
    ($(#[$attr:meta])* $vis:vis static $name:ident: $t:ty = $init:expr; $($rest:tt)*) => {
        $(#[$attr])*
        $vis static $name: $crate::FiberLocal<$t> = $crate::FiberLocal::new({
            fn __fibra_init() -> $t {
                $init
            }
            __fibra_init
        });
        $crate::fiber_local!($($rest)*);
    };
    ($(#[$attr:meta])* $vis:vis static $name:ident: $t:ty = $init:expr) => {
        $crate::fiber_local!($(#[$attr])* $vis static $name: $t = $init;);
    };
}

thread_local! {
    /// The values of code outside scheduled fibers.
    static THREAD: ThreadLocals = const { ThreadLocals(Locals::new()) };
}

/// The values of a table: the address of each one's static, and the value.
type Entries = Vec<(usize, Box<dyn Any>)>;

/// One fiber's (or thread's) values: the address of each one's static, and the value.
pub(crate) struct Locals {
    /// Boxed, and only once a value is made: one word in every fiber's metadata.
    #[allow(clippy::box_collection)]
    entries: UnsafeCell<Option<Box<Entries>>>,
}

/// How many times the values of a fiber that ends are dropped, while destructors make new
/// ones; what is left after that is leaked.
const DROP_ROUNDS: usize = 8;

impl Locals {
    pub(crate) const fn new() -> Self {
        Locals {
            entries: UnsafeCell::new(None),
        }
    }

    /// The value of the static at `key`, made by `init` if there is none. The pointer stays
    /// valid until the table is cleared.
    fn get_or_init<T: 'static>(&self, key: usize, init: fn() -> T) -> *const T {
        if let Some(v) = self.find::<T>(key) {
            return v;
        }
        // Made without a borrow of the table: `init` may reach other fiber-locals.
        let value = Box::new(init());
        if let Some(v) = self.find::<T>(key) {
            // `init` reached this very value, which is there now: keep that one.
            drop(value);
            return v;
        }
        let p: *const T = &*value;
        // SAFETY: only the owning fiber or thread reaches the table, and no reference into
        // the vector outlives a call (values are boxed: references to them stay valid).
        unsafe {
            (*self.entries.get())
                .get_or_insert_default()
                .push((key, value))
        };
        p
    }

    fn find<T: 'static>(&self, key: usize) -> Option<*const T> {
        // SAFETY: as in `get_or_init`; the borrow ends before this returns.
        let entries = unsafe { &*self.entries.get() }.as_deref()?;
        entries.iter().find(|(k, _)| *k == key).map(|(_, v)| {
            let v: &T = v
                .downcast_ref()
                .expect("a fiber-local's key is its static's address");
            v as *const T
        })
    }

    /// Whether the table holds no value.
    pub(crate) fn is_empty(&self) -> bool {
        // SAFETY: as in `get_or_init`.
        unsafe { (*self.entries.get()).as_ref().is_none_or(|e| e.is_empty()) }
    }

    /// Drops every value (and those their destructors make, for a few rounds), catching
    /// their panics: the first payload.
    fn clear(&self) -> Option<Box<dyn Any + Send>> {
        let mut first = None;
        for _ in 0..DROP_ROUNDS {
            // SAFETY: as in `get_or_init`; the values are moved out before any destructor
            // runs, so a destructor that reaches the table finds it empty.
            let values = std::mem::take(unsafe { &mut *self.entries.get() }).unwrap_or_default();
            if values.is_empty() {
                return first;
            }
            for (_, value) in *values {
                match catch_unwind(AssertUnwindSafe(move || drop(value))) {
                    Ok(()) => {}
                    // The fiber was cancelled while a destructor waited: the destructor
                    // ended there, and the task's end stands.
                    Err(p) if p.is::<super::Cancelled>() => {
                        super::caught_cancelled();
                        drop(p);
                    }
                    Err(p) if first.is_none() => first = Some(p),
                    Err(p) => crate::report::drop_catching(p),
                }
            }
        }
        // Destructors that keep making values: leak the rest.
        // SAFETY: as above.
        std::mem::forget(std::mem::take(unsafe { &mut *self.entries.get() }));
        first
    }
}

impl Drop for Locals {
    fn drop(&mut self) {
        // A fiber's table is cleared inside the fiber (`end_of_fiber`); values left over
        // belong to a fiber that never ended, and may be `!Send` values of a thread other
        // than the one dropping its cell: leaked, never dropped here.
        std::mem::forget(std::mem::take(self.entries.get_mut()));
    }
}

/// A thread's table, cleared as the thread exits.
struct ThreadLocals(Locals);

impl Drop for ThreadLocals {
    fn drop(&mut self) {
        let _ = self.0.clear();
    }
}

/// Called by a task's body in its own fiber once the task's closure has ended: drops the
/// fiber's values there, with the fiber's context. `Some(payload)` if a destructor panicked.
pub(crate) fn end_of_fiber(meta: &FiberMeta) -> Option<Box<dyn Any + Send>> {
    meta.locals.clear()
}
