//! The macros: `select!` (crossbeam-channel's syntax) and `select_biased!`.

/// Waits for the first of several channel operations to complete and runs its arm, with
/// crossbeam-channel's syntax:
///
/// ```text
/// select! {
///     recv(rx) -> msg => { … },        // msg: Result<T, RecvError>
///     send(tx, value) -> res => { … }, // res: Result<(), SendError<T>>
///     default => { … },                // none is ready now (optional)
///     default(timeout) => { … },       // none got ready within timeout (instead)
/// }
/// ```
///
/// `recv` takes a fibra [`mpsc::Receiver`](crate::sync::mpsc::Receiver),
/// [`mpmc::Receiver`](crate::sync::mpmc::Receiver) or
/// [`CancellationToken`](crate::sync::CancellationToken) (ready once cancelled, with
/// `Ok(())`); `send` an `mpsc` or `mpmc` `Sender` or `SyncSender` — each as a value, by
/// reference, behind any `Deref` (`Arc`, `Box`), or as a temporary (`recv(get())`), which
/// lives until the select ends. A receive from a channel whose senders are all gone, and a
/// send to one whose receivers are gone, complete at once with an error, as in crossbeam.
/// Each channel expression is evaluated once, before anything else. A send's message is
/// evaluated only when that send is tried against a channel that can take it, or offered on
/// a rendezvous channel by a select about to wait, so a select that completes another
/// operation does not evaluate it (it runs in a closure: `?` and `return` in it act on that
/// closure, not on the surrounding function). Trailing commas are accepted everywhere.
///
/// Without `default` the select waits — suspending a fiber, blocking a plain thread — until
/// one operation completes. When several are ready, one is chosen at random, so none
/// starves ([`select_biased!`](crate::select_biased) prefers the first). Exactly one
/// operation completes. Arm bodies run outside any loop of the macro, so `break`,
/// `continue`, `return` and `?` act on the surrounding code. At most 32 operations per
/// select. A select with only a `default` runs it (after sleeping its timeout, if it has
/// one); `default()` is `default`.
///
/// On a rendezvous channel (`sync_channel(0)`) a send completes only when a receiver takes
/// the message and a receive only when a sender gives one: a waiting select offers both
/// there, and the other side — `recv`, `try_recv`, `send`, `try_send`, or another select —
/// completes them; selects on the two ends of one such channel meet, as with crossbeam. If
/// an offered operation and another of the select's become possible together, exactly one
/// of them completes; the offers are made from a random arm on, so none is favoured.
///
/// ```
/// use fibra::sync::{mpsc, CancellationToken};
/// use std::time::Duration;
///
/// let sched = fibra::Scheduler::builder().threads(2).build().unwrap();
/// sched.start();
/// let (tx, rx) = mpsc::channel::<u32>();
/// let stop = CancellationToken::new();
/// let s = stop.clone();
/// let worker = sched.spawn(move || {
///     let mut sum = 0;
///     loop {
///         fibra::select! {
///             recv(rx) -> msg => match msg {
///                 Ok(n) => sum += n,
///                 Err(_) => break, // every sender gone
///             },
///             recv(s) -> _ => break, // cancelled
///             default(Duration::from_secs(10)) => panic!("nothing for 10 s"),
///         }
///     }
///     sum
/// });
/// for n in 1..=4 {
///     tx.send(n).unwrap();
/// }
/// drop(tx);
/// assert_eq!(worker.join().unwrap(), 10);
/// stop.cancel();
/// ```
#[macro_export]
macro_rules! select {
    ($($tokens:tt)*) => {
        $crate::__select_internal!(@parse ($crate::sync::select::run) [] []
            (0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31)
            $($tokens)*)
    };
}

/// [`select!`](crate::select), but when several operations are ready the first of them (in
/// the order written) completes, and a waiting select's offers on rendezvous channels are
/// made in that order too: for priorities, at the cost of starving the later arms.
///
/// ```
/// use fibra::sync::mpsc;
/// let (urgent_tx, urgent) = mpsc::channel::<u32>();
/// let (normal_tx, normal) = mpsc::channel::<u32>();
/// normal_tx.send(1).unwrap();
/// urgent_tx.send(2).unwrap();
/// let got = fibra::select_biased! {
///     recv(urgent) -> m => m.unwrap(),
///     recv(normal) -> m => m.unwrap(),
/// };
/// assert_eq!(got, 2);
/// ```
#[macro_export]
macro_rules! select_biased {
    ($($tokens:tt)*) => {
        $crate::__select_internal!(@parse ($crate::sync::select::run_biased) [] []
            (0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31)
            $($tokens)*)
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __select_internal {
    // ---- parsing, one arm at a time, into [ (index kind (chan) (msg) (pat) (body)) ... ]
    // and [ (mode) (body) ] for the default ----
    (@parse $run:tt $arms:tt $def:tt $is:tt , $($rest:tt)*) => {
        $crate::__select_internal!(@parse $run $arms $def $is $($rest)*)
    };
    (@parse $run:tt $arms:tt $def:tt ($i:tt $($is:tt)*)
        recv($r:expr $(,)?) -> $p:pat => $($rest:tt)*) => {
        $crate::__select_internal!(@body $run $arms $def ($($is)*) (arm $i recv ($r) () ($p)) $($rest)*)
    };
    (@parse $run:tt $arms:tt $def:tt ($i:tt $($is:tt)*)
        send($s:expr, $m:expr $(,)?) -> $p:pat => $($rest:tt)*) => {
        $crate::__select_internal!(@body $run $arms $def ($($is)*) (arm $i send ($s) ($m) ($p)) $($rest)*)
    };
    (@parse $run:tt $arms:tt $def:tt $is:tt default $(())? => $($rest:tt)*) => {
        $crate::__select_internal!(@body $run $arms $def $is (default ($crate::sync::select::Mode::Now) ()) $($rest)*)
    };
    (@parse $run:tt $arms:tt $def:tt $is:tt default($t:expr $(,)?) => $($rest:tt)*) => {
        $crate::__select_internal!(@body $run $arms $def $is (default ($crate::sync::select::Mode::For($t)) ($t)) $($rest)*)
    };
    (@parse $run:tt $arms:tt $def:tt () recv $($rest:tt)*) => {
        ::core::compile_error!("select!: at most 32 operations")
    };
    (@parse $run:tt $arms:tt $def:tt () send $($rest:tt)*) => {
        ::core::compile_error!("select!: at most 32 operations")
    };
    // ---- an arm's body: a block (a comma after it is optional), or an expression ----
    (@body $run:tt [$($arms:tt)*] $def:tt $is:tt (arm $($a:tt)*) $body:block $($rest:tt)*) => {
        $crate::__select_internal!(@parse $run [$($arms)* ($($a)* ($body))] $def $is $($rest)*)
    };
    (@body $run:tt [$($arms:tt)*] $def:tt $is:tt (arm $($a:tt)*) $body:expr $(, $($rest:tt)*)?) => {
        $crate::__select_internal!(@parse $run [$($arms)* ($($a)* ($body))] $def $is $($($rest)*)?)
    };
    (@body $run:tt $arms:tt [] $is:tt (default $mode:tt $t:tt) $body:block $($rest:tt)*) => {
        $crate::__select_internal!(@parse $run $arms [$mode $t ($body)] $is $($rest)*)
    };
    (@body $run:tt $arms:tt [] $is:tt (default $mode:tt $t:tt) $body:expr $(, $($rest:tt)*)?) => {
        $crate::__select_internal!(@parse $run $arms [$mode $t ($body)] $is $($($rest)*)?)
    };
    (@body $run:tt $arms:tt [$($def:tt)+] $($rest:tt)*) => {
        ::core::compile_error!("select!: more than one `default` arm")
    };
    // ---- done ----
    (@parse $run:tt [] [] $is:tt) => {
        ::core::compile_error!("select!: no `recv`, `send` or `default` arm")
    };
    // Only a default: it runs, after its timeout if it has one.
    (@parse $run:tt [] [$mode:tt () ($dbody:expr)] $is:tt) => {
        $dbody
    };
    (@parse $run:tt [] [$mode:tt ($t:expr) ($dbody:expr)] $is:tt) => {{
        $crate::sleep($t);
        $dbody
    }};
    (@parse $run:tt [$($arm:tt)+] [] $is:tt) => {
        $crate::__select_internal!(@emit $run [$($arm)+] ($crate::sync::select::Mode::Block)
            (::core::unreachable!("a blocking select completes an operation")))
    };
    (@parse $run:tt [$($arm:tt)+] [$mode:tt $t:tt ($dbody:expr)] $is:tt) => {
        $crate::__select_internal!(@emit $run [$($arm)+] $mode ($dbody))
    };
    (@parse $($other:tt)*) => {
        ::core::compile_error!("select!: expected `recv(r) -> pat => body`, `send(s, v) -> pat => body`, `default => body` or `default(timeout) => body`")
    };
    // ---- one operation, on the channel reached through any `&`/`Deref` ----
    (@op recv ($c:expr) ()) => {
        $crate::sync::select::RecvOp::new($c.__fibra_select_recv())
    };
    (@op send ($c:expr) ($m:expr)) => {
        $crate::sync::select::SendOp::new($c.__fibra_select_send(), || $m)
    };
    (@emit ($run:path) [$(($i:tt $kind:ident ($chan:expr) ($($m:expr)?) ($p:pat) ($body:expr)))+] ($mode:expr) ($dbody:expr)) => {
        // The channels first, as the scrutinee: temporaries among them live to the end.
        match ($(&$chan,)+) {
            __fibra_chans => {
                #[allow(unused_imports)]
                use $crate::sync::select::{SelectRecvRef as _, SelectSendRef as _};
                let mut __ops = ($($crate::__select_internal!(@op $kind (__fibra_chans.$i) ($($m)?)),)+);
                let __selected = $run(
                    &mut [$(&mut __ops.$i as &mut dyn $crate::sync::select::Op),+],
                    $mode,
                );
                match __selected {
                    $(::core::option::Option::Some($i) => {
                        let __result = __ops.$i.take();
                        // The operations (and what their messages borrow) end here, before
                        // the arm's body.
                        #[allow(clippy::drop_non_drop)]
                        ::core::mem::drop(__ops);
                        let $p = __result;
                        $body
                    })+
                    ::core::option::Option::None => {
                        #[allow(clippy::drop_non_drop)]
                        ::core::mem::drop(__ops);
                        $dbody
                    }
                    ::core::option::Option::Some(_) => ::core::unreachable!(),
                }
            }
        }
    };
}
