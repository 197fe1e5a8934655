//! A minimal oneshot channel for fibra, built only on the core API (`fibra::park` and
//! `Unparker`). ping_pong uses it until `fibra::sync::oneshot` exists; the report labels fibra's
//! ping_pong figure accordingly. It works from fibers (suspends the fiber) and from plain threads
//! (`park` blocks the thread there).

use std::sync::{Arc, Mutex};

struct Slot<T> {
    value: Option<T>,
    waiter: Option<fibra::Unparker>,
}

struct Inner<T> {
    slot: Mutex<Slot<T>>,
}

/// Sending half: consumed by [`Sender::send`].
pub struct Sender<T>(Arc<Inner<T>>);

/// Receiving half: consumed by [`Receiver::recv`].
pub struct Receiver<T>(Arc<Inner<T>>);

pub fn channel<T>() -> (Sender<T>, Receiver<T>) {
    let inner = Arc::new(Inner {
        slot: Mutex::new(Slot {
            value: None,
            waiter: None,
        }),
    });
    (Sender(inner.clone()), Receiver(inner))
}

impl<T> Sender<T> {
    /// Stores the value and wakes the receiver if it is already parked.
    pub fn send(self, value: T) {
        let waiter = {
            let mut slot = self.0.slot.lock().expect("oneshot lock");
            slot.value = Some(value);
            slot.waiter.take()
        };
        if let Some(u) = waiter {
            u.unpark();
        }
    }
}

impl<T> Receiver<T> {
    /// Waits for the value. The unparker is published only from `park`'s register callback,
    /// i.e. after the fiber has switched out; if the value arrived in between, the callback
    /// wakes the fiber at once and the loop picks the value up.
    pub fn recv(self) -> T {
        loop {
            if let Some(v) = self.0.slot.lock().expect("oneshot lock").value.take() {
                return v;
            }
            fibra::park(|u| {
                let mut slot = self.0.slot.lock().expect("oneshot lock");
                if slot.value.is_some() {
                    drop(slot);
                    u.unpark();
                } else {
                    slot.waiter = Some(u);
                }
            });
        }
    }
}
