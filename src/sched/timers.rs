//! A worker's timers: fibers parked with a deadline, in a hierarchical timing wheel that
//! files by the millisecond and fires to the nanosecond.
//!
//! Entries live on the fiber's home worker, so expiry never moves a fiber. A fiber woken
//! before its deadline has its timer cancelled when it resumes, so the wheel holds only
//! timers that can still fire.
//!
//! # Precision
//!
//! Every timer keeps its exact deadline (nanoseconds, `Instant`'s own resolution).
//! [`TimerWheel::pop_due`] returns a timer only once `now >= deadline` — never early — and
//! returns every such timer; [`TimerWheel::next_deadline`] is the exact earliest deadline
//! (or, after cancellations, possibly earlier: never later), which the worker sleeps until.
//! How late a timer fires is therefore the worker's wake-up latency — the kernel's timer
//! slack (50 µs for a normal thread) plus a futex or `epoll_pwait2` return, the same as
//! `std::thread::sleep` — plus whatever the worker was running. Nothing is rounded to a
//! tick: `fibra::sleep(1 ms)` takes 1 ms plus that latency, not 2 ms.
//!
//! # How
//!
//! The wheel only *files*: a timer goes into the slot of its millisecond (its *tick*),
//! `deadline / 1 ms`, so insert and cancel stay O(1) (a push, a swap-remove). Each slot
//! remembers the earliest deadline filed into it (a lower bound once one was cancelled:
//! cancelling does not look for the next), which is what `next_deadline` reports for the
//! first occupied slot. When that earliest deadline has passed, the slot's timers of that
//! millisecond — at most one millisecond's worth — come: they are sorted by exact deadline
//! into the *run*, O(k log k) once for k timers (O(k) when they share a deadline), from
//! whose end `pop_due` takes them, O(1) each, as they come due. A timer inserted into a
//! millisecond that has already come (a deadline within the current millisecond, or past)
//! goes into *late*, a binary min-heap, usually tiny; `pop_due` takes the earlier of the
//! run's end and late's top. Cancelling a timer in either marks it dead, O(1); a dead entry
//! is freed when it is the next to come (at once if it is), so both ends are always live.
//! 10 000 timers in one millisecond thus cost one sort and one pop each — never a scan per
//! pass — and a pass that finds nothing due costs one comparison, or, with nothing come,
//! one look at the first occupied slot's earliest deadline.
//!
//! Why a wheel: with 1 000 000 pending timers, every operation of a heap walks 10-20 levels
//! of a large array, a likely cache miss at each, where the wheel files a timer in O(1) and
//! fires it from a short sorted run; cancelling is O(1) here, O(log n) in a 4-ary heap with
//! handles and not possible in `std`'s binary heap (`cargo bench --bench timers` compares
//! the three). What a wheel pays instead is a cache miss per timer each time its slot is
//! cascaded or comes; prefetching a few nodes ahead in that loop overlaps those misses.
//!
//! Layout: six levels of 64 slots; level `l` slots span `64^l` ticks, so the wheel looks
//! about two years ahead; a later deadline is filed at that horizon and re-filed from there.
//! A slot of level `l > 0` is cascaded — its timers re-filed into lower levels, or come if
//! their tick has — when its earliest deadline has passed.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::{Duration, Instant};

/// Identifies one inserted timer, for [`TimerWheel::remove`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct TimerId(usize);

/// Levels of the wheel: level `l`'s slots span `SLOTS^l` ticks.
const LEVELS: usize = 6;
/// Bits of a tick number that pick a slot within one level.
const SLOT_BITS: u32 = 6;
/// Slots per level.
const SLOTS: usize = 1 << SLOT_BITS;
/// A tick, the span of one level-0 slot: 1 ms, in nanoseconds.
const TICK_NS: u64 = 1_000_000;
/// How many nodes ahead a slot's cascade asks the CPU to load (see `pop_due`): each node is
/// a cache miss, and loading several ahead overlaps them instead of waiting for each in turn.
const PREFETCH_AHEAD: usize = 8;
/// How far ahead of its clock the wheel files a timer: up to 63 top-level slots, so a timer
/// never lands in the top-level slot the clock is in. A later deadline is filed at the horizon
/// and re-filed when that slot comes up, until it is really due.
const HORIZON: u64 = (SLOTS as u64 - 1) << (SLOT_BITS as usize * (LEVELS - 1));

/// Where a node is: filed in a slot, among the timers whose tick has come (`run` or
/// `late`), or free.
#[derive(Clone, Copy)]
enum Place {
    Slot { level: u8, slot: u8, pos: u32 },
    Come,
    Free,
}

struct Node<T> {
    /// The exact deadline, in nanoseconds after the wheel's `start` (saturating).
    deadline: u64,
    place: Place,
    /// `None` once fired or cancelled (a cancelled node in `run` or `late` waits there until
    /// it is the next to come, then is freed).
    value: Option<T>,
}

impl<T> Node<T> {
    fn tick(&self) -> u64 {
        self.deadline / TICK_NS
    }
}

struct Level {
    /// Bit `s` set: slot `s` is not empty.
    occupied: u64,
    /// Per slot: no timer in it is due before this (nanoseconds after `start`); `u64::MAX`
    /// while empty. Exact until a timer of the slot is cancelled, then possibly early.
    earliest: [u64; SLOTS],
    slots: Vec<Vec<usize>>,
}

/// A hierarchical timing wheel that files by 1 ms ticks and fires at exact deadlines, with
/// O(1) insert and cancel by [`TimerId`].
pub struct TimerWheel<T> {
    start: Instant,
    /// The last tick whose timers have come: every timer with a tick at or before it is in
    /// `run` or `late`, every later one is filed in a slot.
    elapsed: u64,
    levels: Vec<Level>,
    nodes: Vec<Node<T>>,
    free: Vec<usize>,
    /// The timers of the last slot that came up, as `(deadline, node)` sorted latest first:
    /// the earliest is popped off the end. Its last entry is always live.
    run: Vec<(u64, usize)>,
    /// Timers inserted into a tick that had already come, after `run` was sorted: a
    /// min-heap by deadline (usually small: only deadlines within the current millisecond
    /// or past). Its top is always live.
    late: BinaryHeap<Reverse<(u64, usize)>>,
    len: usize,
}

impl<T> Default for TimerWheel<T> {
    fn default() -> Self {
        TimerWheel::new(Instant::now())
    }
}

impl<T> TimerWheel<T> {
    /// A wheel whose clock starts at `start`; deadlines before it count as `start`.
    pub fn new(start: Instant) -> Self {
        TimerWheel {
            start,
            elapsed: 0,
            levels: (0..LEVELS)
                .map(|_| Level {
                    occupied: 0,
                    earliest: [u64::MAX; SLOTS],
                    slots: (0..SLOTS).map(|_| Vec::new()).collect(),
                })
                .collect(),
            nodes: Vec::new(),
            free: Vec::new(),
            run: Vec::new(),
            late: BinaryHeap::new(),
            len: 0,
        }
    }

    /// `at` in nanoseconds after `start`: exact, saturating at both ends.
    fn nanos(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.start).as_nanos()).unwrap_or(u64::MAX)
    }

    /// The instant `nanos` after `start` (exactly the deadline it was made from).
    fn instant_of(&self, nanos: u64) -> Instant {
        self.start
            .checked_add(Duration::from_nanos(nanos))
            .unwrap_or_else(crate::sys::far_future)
    }

    /// Adds a timer that fires once its exact `deadline` has passed.
    pub fn insert(&mut self, deadline: Instant, value: T) -> TimerId {
        let node = Node {
            deadline: self.nanos(deadline),
            place: Place::Free,
            value: Some(value),
        };
        let id = match self.free.pop() {
            Some(id) => {
                self.nodes[id] = node;
                id
            }
            None => {
                self.nodes.push(node);
                self.nodes.len() - 1
            }
        };
        if self.nodes[id].tick() <= self.elapsed {
            // Its millisecond has come (or gone): among the timers that have.
            self.nodes[id].place = Place::Come;
            self.late.push(Reverse((self.nodes[id].deadline, id)));
        } else {
            self.file(id);
        }
        self.len += 1;
        TimerId(id)
    }

    /// Puts node `id`, whose tick is after `elapsed`, into the slot its tick belongs to
    /// (at most `HORIZON` ahead).
    fn file(&mut self, id: usize) {
        let real = self.nodes[id].tick();
        let tick = real.min(self.elapsed.saturating_add(HORIZON));
        debug_assert!(tick > self.elapsed, "a timer whose tick came is not filed");
        // A timer filed at the horizon may be due only then: the slot must not promise later.
        let earliest = if tick < real {
            tick * TICK_NS
        } else {
            self.nodes[id].deadline
        };
        // The highest 6-bit group in which the tick differs from the clock picks the level.
        let differ = (tick ^ self.elapsed) | (SLOTS as u64 - 1);
        let level = ((63 - differ.leading_zeros()) / SLOT_BITS) as usize;
        let level = level.min(LEVELS - 1);
        let slot = ((tick >> (SLOT_BITS as usize * level)) & (SLOTS as u64 - 1)) as usize;
        let l = &mut self.levels[level];
        let list = &mut l.slots[slot];
        self.nodes[id].place = Place::Slot {
            level: level as u8,
            slot: slot as u8,
            pos: list.len() as u32,
        };
        list.push(id);
        l.occupied |= 1 << slot;
        l.earliest[slot] = l.earliest[slot].min(earliest);
    }

    /// Starts loading node `id` into the cache, so that touching it later does not wait.
    #[inline(always)]
    fn prefetch_node(&self, id: usize) {
        #[cfg(target_arch = "x86_64")]
        {
            let p = self.nodes.as_ptr().wrapping_add(id).cast::<i8>();
            // SAFETY: a prefetch is a hint: it never faults, has no observable effect and
            // takes any address (`id` is in range anyway; `wrapping_add` keeps even a wrong
            // one defined).
            unsafe { std::arch::x86_64::_mm_prefetch(p, std::arch::x86_64::_MM_HINT_T0) }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = id;
    }

    /// Takes node `id` out of its slot.
    fn unfile(&mut self, id: usize) {
        let Place::Slot { level, slot, pos } = self.nodes[id].place else {
            return;
        };
        let (level, slot, pos) = (level as usize, slot as usize, pos as usize);
        let list = &mut self.levels[level].slots[slot];
        list.swap_remove(pos);
        if let Some(&moved) = list.get(pos) {
            if let Place::Slot { pos: p, .. } = &mut self.nodes[moved].place {
                *p = pos as u32;
            }
        }
        if list.is_empty() {
            self.levels[level].occupied &= !(1 << slot);
            self.levels[level].earliest[slot] = u64::MAX;
        }
        self.nodes[id].place = Place::Free;
    }

    /// Cancels a timer that has not been returned by `pop_due`; returns its value.
    pub fn remove(&mut self, id: TimerId) -> Option<T> {
        let node = self.nodes.get_mut(id.0)?;
        let value = node.value.take()?;
        match node.place {
            Place::Slot { .. } => {
                self.unfile(id.0);
                self.free.push(id.0);
            }
            // Dead where it waits: freed when it is the next to come, which may be now.
            Place::Come => self.drop_dead(),
            Place::Free => unreachable!("a free node has no value"),
        }
        self.len -= 1;
        Some(value)
    }

    /// Frees the cancelled entries at the end of `run` and the top of `late`, so that both
    /// are live.
    fn drop_dead(&mut self) {
        while let Some(&(_, id)) = self.run.last() {
            if self.nodes[id].value.is_some() {
                break;
            }
            self.run.pop();
            self.nodes[id].place = Place::Free;
            self.free.push(id);
        }
        while let Some(&Reverse((_, id))) = self.late.peek() {
            if self.nodes[id].value.is_some() {
                break;
            }
            self.late.pop();
            self.nodes[id].place = Place::Free;
            self.free.push(id);
        }
    }

    /// The earliest of the timers whose tick has come: `(deadline, node)`, and whether it
    /// is in `late` (else at the end of `run`).
    fn next_come(&self) -> Option<(u64, usize, bool)> {
        match (self.run.last(), self.late.peek()) {
            (Some(&(r, id)), Some(&Reverse((l, _)))) if r <= l => Some((r, id, false)),
            (_, Some(&Reverse((l, id)))) => Some((l, id, true)),
            (Some(&(r, id)), None) => Some((r, id, false)),
            (None, None) => None,
        }
    }

    /// The first occupied slot, its level and the tick at which it starts, if any.
    fn next_expiration(&self) -> Option<(u64, usize, usize)> {
        for (level, l) in self.levels.iter().enumerate() {
            if l.occupied == 0 {
                continue;
            }
            let shift = SLOT_BITS as usize * level;
            let current = ((self.elapsed >> shift) & (SLOTS as u64 - 1)) as u32;
            // Slots before the current one at this level are empty (cascaded or fired).
            let distance = l.occupied.rotate_right(current).trailing_zeros();
            let slot = (current + distance) as usize % SLOTS;
            let window = self.elapsed & !((1u64 << (shift + SLOT_BITS as usize)) - 1);
            let mut tick = window + ((slot as u64) << shift);
            if slot < current as usize {
                tick += 1u64 << (shift + SLOT_BITS as usize);
            }
            return Some((tick.max(self.elapsed), level, slot));
        }
        None
    }

    /// The earliest deadline, exact — or earlier, never later, after a cancellation — or
    /// `None` if no timer is pending.
    pub fn next_deadline(&self) -> Option<Instant> {
        // Every timer whose tick has come is due before every filed one.
        if let Some((deadline, _, _)) = self.next_come() {
            return Some(self.instant_of(deadline));
        }
        self.next_expiration()
            .map(|(_, level, slot)| self.instant_of(self.levels[level].earliest[slot]))
    }

    /// Removes and returns a timer whose deadline is at or before `now`, earliest first.
    pub fn pop_due(&mut self, now: Instant) -> Option<T> {
        let now = self.nanos(now);
        loop {
            if let Some((deadline, id, late)) = self.next_come() {
                // Filed timers are all due after it: nothing is due yet.
                if deadline > now {
                    return None;
                }
                if late {
                    self.late.pop();
                } else {
                    self.run.pop();
                }
                let node = &mut self.nodes[id];
                node.place = Place::Free;
                let value = node.value.take();
                self.free.push(id);
                self.drop_dead();
                self.len -= 1;
                return Some(value.expect("the next timer to come is live"));
            }
            let (tick, level, slot) = self.next_expiration()?;
            if self.levels[level].earliest[slot] > now {
                return None;
            }
            // The slot may hold due timers: its tick has come (the earliest deadline is in
            // its span), so the clock moves there and its timers come, or go lower.
            self.elapsed = tick;
            let mut ids = std::mem::take(&mut self.levels[level].slots[slot]);
            self.levels[level].occupied &= !(1 << slot);
            self.levels[level].earliest[slot] = u64::MAX;
            // `run` and `late` are empty (else something in them would be due before this
            // slot): the slot's timers of this tick become the new run, sorted latest first.
            // One pass, loading nodes a few ahead: each is a cache miss, scattered over the
            // node array, and waiting for them one at a time would make this loop the wheel's
            // cost.
            for (i, &id) in ids.iter().enumerate() {
                if let Some(&ahead) = ids.get(i + PREFETCH_AHEAD) {
                    self.prefetch_node(ahead);
                }
                let node = &mut self.nodes[id];
                if node.tick() <= tick {
                    node.place = Place::Come;
                    self.run.push((node.deadline, id));
                } else {
                    self.file(id);
                }
            }
            self.run
                .sort_unstable_by_key(|&(deadline, _)| Reverse(deadline));
            // Keep the emptied Vec's allocation for the slot's next use.
            ids.clear();
            if self.levels[level].slots[slot].is_empty() {
                self.levels[level].slots[slot] = ids;
            }
        }
    }

    /// How many timers are pending.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no timer is pending.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// xorshift64: deterministic pseudo-random numbers.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    fn ns(n: u64) -> Duration {
        Duration::from_nanos(n)
    }

    #[test]
    fn fires_everything_in_deadline_order_at_the_first_look_after_its_deadline() {
        let t0 = Instant::now();
        let mut w = TimerWheel::new(t0);
        let mut expected = Vec::new();
        // Deadlines from 0 ms to ~70 s, scrambled, across several levels.
        for k in 0..5_000u64 {
            let ms = (k * 7919) % 70_001;
            let d = t0 + Duration::from_millis(ms) + Duration::from_micros(300);
            w.insert(d, (ms, k));
            expected.push((ms, k));
        }
        assert_eq!(w.len(), 5_000);
        let step = Duration::from_micros(700);
        let mut now = t0;
        let mut fired = Vec::new();
        while fired.len() < expected.len() {
            now += step;
            while let Some((ms, k)) = w.pop_due(now) {
                let deadline = t0 + Duration::from_millis(ms) + Duration::from_micros(300);
                assert!(now >= deadline, "fired early: {ms} ms at {:?}", now - t0);
                // Not rounded to a tick: the first look after the deadline fires it.
                assert!(
                    now - deadline < step,
                    "fired late: {ms} ms at {:?}",
                    now - t0
                );
                fired.push((ms, k));
            }
        }
        let order: Vec<u64> = fired.iter().map(|f| f.0).collect();
        let mut sorted = order.clone();
        sorted.sort();
        assert_eq!(order, sorted);
        assert!(w.is_empty());
    }

    /// Random deadlines (to the nanosecond, past ones too), cancels and clock steps (from
    /// 1 ns to seconds) against a model: nothing fires early, everything due fires at the
    /// first look, in deadline order, and `next_deadline` is never late — and exact while
    /// nothing was cancelled.
    #[test]
    fn random_deadlines_never_fire_early_nor_after_the_first_look() {
        for seed in 1..=8u64 {
            let t0 = Instant::now();
            let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
            let mut w = TimerWheel::new(t0);
            // (deadline ns, key) of every pending timer, and the ids by key.
            let mut model = BTreeSet::new();
            let mut ids = std::collections::HashMap::new();
            let mut now = 0u64;
            let mut key = 0u64;
            let mut cancelled_since_exact = false;
            for round in 0..4_000 {
                for _ in 0..rng.below(8) {
                    let offset = match rng.below(10) {
                        0 => rng.below(2_000),             // within 2 µs
                        1..=4 => rng.below(3 * TICK_NS),   // within 3 ms
                        5..=7 => rng.below(200 * TICK_NS), // within 200 ms
                        8 => rng.below(90_000 * TICK_NS),  // within 90 s
                        _ => 0,
                    };
                    // Some deadlines already passed (or before the wheel's start).
                    let d = if rng.below(20) == 0 {
                        now.saturating_sub(rng.below(5 * TICK_NS))
                    } else {
                        now + offset
                    };
                    key += 1;
                    ids.insert(key, w.insert(t0 + ns(d), key));
                    model.insert((d, key));
                }
                // Odd seeds never cancel, so next_deadline must stay exact throughout.
                if seed % 2 == 0 && rng.below(4) == 0 && !model.is_empty() {
                    let nth = rng.below(model.len() as u64) as usize;
                    let (d, k) = *model.iter().nth(nth).unwrap();
                    model.remove(&(d, k));
                    assert_eq!(w.remove(ids.remove(&k).unwrap()), Some(k));
                    cancelled_since_exact = true;
                }
                assert_eq!(w.len(), model.len());
                if let Some(&(min, _)) = model.first() {
                    let next = w.next_deadline().expect("pending");
                    assert!(next <= t0 + ns(min), "round {round}: next_deadline late");
                    if !cancelled_since_exact {
                        assert_eq!(next, t0 + ns(min), "round {round}: next_deadline inexact");
                    }
                } else {
                    assert!(w.next_deadline().is_none());
                }
                now += match rng.below(6) {
                    0 => rng.below(1_000),
                    1 | 2 => rng.below(TICK_NS),
                    3 | 4 => rng.below(10 * TICK_NS),
                    _ => rng.below(2_000 * TICK_NS),
                };
                // Half the time, look exactly at the earliest deadline, as a worker does.
                if rng.below(2) == 0 {
                    if let Some(next) = w.next_deadline() {
                        now = now.max(w.nanos(next));
                    }
                }
                let mut last = 0;
                while let Some(k) = w.pop_due(t0 + ns(now)) {
                    let (d, _) = *model.iter().find(|e| e.1 == k).expect("pending");
                    assert!(d <= now, "fired {} ns early", d - now);
                    assert!(d >= last, "out of deadline order");
                    last = d;
                    model.remove(&(d, k));
                    ids.remove(&k);
                }
                if let Some(&(d, _)) = model.first() {
                    assert!(d > now, "round {round}: a due timer did not fire");
                }
                if model.is_empty() {
                    cancelled_since_exact = false;
                }
            }
        }
    }

    #[test]
    fn cancel_removes_only_that_timer_and_next_deadline_follows() {
        let t0 = Instant::now();
        let mut w = TimerWheel::new(t0);
        let a = w.insert(t0 + Duration::from_millis(5), "a");
        let b = w.insert(t0 + Duration::from_millis(5000), "b");
        let c = w.insert(t0 + Duration::from_secs(3600), "c");
        assert_eq!(w.next_deadline(), Some(t0 + Duration::from_millis(5)));
        assert_eq!(w.remove(a), Some("a"));
        assert_eq!(w.remove(a), None);
        assert!(w.next_deadline().unwrap() <= t0 + Duration::from_millis(5000));
        assert_eq!(w.pop_due(t0 + Duration::from_millis(4999)), None);
        assert_eq!(w.next_deadline(), Some(t0 + Duration::from_millis(5000)));
        assert_eq!(w.pop_due(t0 + Duration::from_millis(5000)), Some("b"));
        assert_eq!(w.remove(b), None);
        assert_eq!(w.len(), 1);
        assert_eq!(w.pop_due(t0 + Duration::from_secs(3599)), None);
        assert_eq!(w.pop_due(t0 + Duration::from_secs(3600)), Some("c"));
        assert_eq!(w.remove(c), None);
        assert!(w.is_empty() && w.next_deadline().is_none());
    }

    /// Cancelling works wherever the timer is: filed in a slot, or come (in the run, or in
    /// late), next to come or not; the others still fire, exactly.
    #[test]
    fn cancel_in_a_slot_in_the_run_and_in_late() {
        let t0 = Instant::now();
        let mut w = TimerWheel::new(t0);
        let at = |us: u64| t0 + Duration::from_micros(us);
        let ids: Vec<TimerId> = (0..10u64)
            .map(|k| w.insert(at(3_000 + k * 10), k))
            .collect();
        let later = w.insert(at(9_000), 99);
        // 3.000 ms: the slot of tick 3 comes (the run); the first timer fires.
        assert_eq!(w.pop_due(at(3_000)), Some(0));
        // Now cancel the run's next (1), one behind it (5), and the filed one.
        assert_eq!(w.remove(ids[1]), Some(1));
        assert_eq!(w.remove(ids[5]), Some(5));
        assert_eq!(w.remove(later), Some(99));
        assert_eq!(w.remove(ids[1]), None);
        assert_eq!(w.len(), 7);
        assert_eq!(w.next_deadline(), Some(at(3_020)));
        assert_eq!(w.pop_due(at(3_019)), None);
        let mut fired = Vec::new();
        while let Some(k) = w.pop_due(at(3_090)) {
            fired.push(k);
        }
        assert_eq!(fired, [2, 3, 4, 6, 7, 8, 9]);
        assert!(w.is_empty() && w.next_deadline().is_none());
        // Timers inserted into tick 3 now go to late; cancelling them all, the next to come
        // last, leaves nothing behind, and freed nodes are reused.
        let nodes = w.nodes.len();
        let ids: Vec<TimerId> = (0..10u64).map(|k| w.insert(at(3_100 + k), k)).collect();
        assert_eq!(w.late.len(), 10);
        for id in ids.into_iter().rev() {
            assert!(w.remove(id).is_some());
        }
        assert!(w.is_empty() && w.run.is_empty() && w.late.is_empty());
        assert!(w.next_deadline().is_none());
        assert_eq!(w.nodes.len(), nodes);
    }

    /// Timers inserted into a millisecond that has already come (late) interleave with that
    /// millisecond's run in deadline order.
    #[test]
    fn late_and_run_interleave_in_deadline_order() {
        let t0 = Instant::now();
        let mut w = TimerWheel::new(t0);
        let at = |us: u64| t0 + Duration::from_micros(us);
        for us in [3_000, 3_500, 3_900] {
            w.insert(at(us), us);
        }
        assert_eq!(w.pop_due(at(3_000)), Some(3_000));
        for us in [3_700, 3_200, 2_000] {
            w.insert(at(us), us);
        }
        assert_eq!((w.run.len(), w.late.len()), (2, 3));
        assert_eq!(w.next_deadline(), Some(at(2_000)));
        let mut fired = Vec::new();
        while let Some(us) = w.pop_due(at(3_800)) {
            fired.push(us);
        }
        assert_eq!(fired, [2_000, 3_200, 3_500, 3_700]);
        assert_eq!(w.next_deadline(), Some(at(3_900)));
        assert_eq!(w.pop_due(at(3_900)), Some(3_900));
        assert!(w.is_empty());
    }

    #[test]
    fn deadlines_beyond_the_horizon_wait_and_never_spin() {
        let t0 = Instant::now();
        let mut w = TimerWheel::new(t0);
        // Move the clock well past tick 0 first (the case that once re-filed forever).
        w.insert(t0 + Duration::from_secs(5), 0);
        assert_eq!(w.pop_due(t0 + Duration::from_secs(5)), Some(0));
        let year = Duration::from_secs(365 * 24 * 3600);
        let far = t0 + 3 * year + ns(123_457);
        w.insert(far, 1);
        w.insert(t0 + Duration::from_secs(10), 2);
        assert_eq!(w.pop_due(t0 + Duration::from_secs(9)), None);
        assert_eq!(w.pop_due(t0 + Duration::from_secs(10)), Some(2));
        // Past the horizon (about 2.1 years) the far timer is re-filed, not fired.
        assert_eq!(w.pop_due(t0 + 2 * year + year / 2), None);
        assert!(w.next_deadline().unwrap() <= far);
        // A timer of 2.5 years, filed now at the horizon, is not made to wait for the far one.
        let nearer = far - year / 2;
        w.insert(nearer, 3);
        assert!(w.next_deadline().unwrap() <= nearer);
        assert_eq!(w.pop_due(nearer - ns(1)), None);
        assert_eq!(w.pop_due(nearer), Some(3));
        assert_eq!(w.pop_due(far - ns(1)), None);
        assert_eq!(w.next_deadline(), Some(far));
        assert_eq!(w.pop_due(far), Some(1));
        assert!(w.is_empty());
    }

    /// A timer filed at the horizon must not make its slot look later than its start: a
    /// timer filed later, into a later slot but due earlier, would wait for it.
    #[test]
    fn a_slot_at_the_horizon_is_due_at_its_start() {
        let t0 = Instant::now();
        let year = Duration::from_secs(365 * 24 * 3600);
        let mut w = TimerWheel::new(t0);
        w.insert(t0 + 10 * year, "ten years");
        w.insert(t0 + year, "one year");
        assert_eq!(w.pop_due(t0 + year), Some("one year"));
        let three = t0 + 3 * year;
        w.insert(three, "three years");
        assert!(w.next_deadline().unwrap() <= three);
        while w.next_deadline().unwrap() < three {
            assert_eq!(w.pop_due(w.next_deadline().unwrap()), None);
        }
        assert_eq!(w.pop_due(three), Some("three years"));
        assert_eq!(w.len(), 1);
    }

    #[test]
    fn past_zero_and_huge_deadlines() {
        let t0 = Instant::now();
        let mut w = TimerWheel::new(t0);
        let _ = w.pop_due(t0 + Duration::from_millis(100));
        // Before the wheel's start, and long past: due at once.
        w.insert(t0 - Duration::from_millis(1), 0);
        w.insert(t0, 1);
        assert_eq!(w.pop_due(t0), Some(0));
        assert_eq!(w.pop_due(t0), Some(1));
        // `Duration::ZERO` from now: due now, not a tick later.
        let now = t0 + Duration::from_millis(100) + ns(1);
        w.insert(now + Duration::ZERO, 2);
        assert_eq!(w.next_deadline(), Some(now));
        assert_eq!(w.pop_due(now - ns(1)), None);
        assert_eq!(w.pop_due(now), Some(2));
        // `Duration::MAX` saturates (about thirty years): never due, still cancellable.
        let huge = crate::sys::deadline_after(Duration::MAX);
        let id = w.insert(huge, 3);
        assert_eq!(w.pop_due(t0 + Duration::from_secs(86_400)), None);
        assert!(w.next_deadline().unwrap() <= huge);
        assert_eq!(w.remove(id), Some(3));
        assert!(w.is_empty() && w.next_deadline().is_none());
    }

    /// 10 000 timers in one millisecond, 10 000 more on one instant: each fires exactly at
    /// its deadline, earliest first, and what has come never holds more than that millisecond.
    #[test]
    fn many_timers_in_one_bucket_fire_exactly() {
        let t0 = Instant::now();
        let mut w = TimerWheel::new(t0);
        let mut rng = Rng(0x2545_F491_4F6C_DD1D);
        let base = 7 * TICK_NS;
        let mut deadlines: Vec<u64> = (0..10_000).map(|_| base + rng.below(TICK_NS)).collect();
        for &d in &deadlines {
            w.insert(t0 + ns(d), d);
        }
        for k in 0..10_000 {
            w.insert(t0 + ns(9 * TICK_NS + 1), k);
        }
        deadlines.sort_unstable();
        // Nothing is due before the earliest, and looking moves nothing.
        assert_eq!(w.pop_due(t0 + ns(deadlines[0] - 1)), None);
        assert!(w.run.is_empty() && w.late.is_empty());
        for (i, &d) in deadlines.iter().enumerate() {
            assert_eq!(w.next_deadline(), Some(t0 + ns(d)), "timer {i}");
            assert_eq!(w.pop_due(t0 + ns(d)), Some(d), "timer {i}");
            if deadlines.get(i + 1) != Some(&d) {
                assert_eq!(w.pop_due(t0 + ns(d)), None);
            }
            assert!(w.run.len() + w.late.len() <= 10_000 - i);
        }
        assert_eq!(w.pop_due(t0 + ns(9 * TICK_NS)), None);
        assert_eq!(w.next_deadline(), Some(t0 + ns(9 * TICK_NS + 1)));
        let mut n = 0;
        while w.pop_due(t0 + ns(9 * TICK_NS + 1)).is_some() {
            n += 1;
        }
        assert_eq!(n, 10_000);
        assert!(w.is_empty());
    }
}
