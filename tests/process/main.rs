//! What touches the whole process: `fork` from every context, schedulers nested in and
//! stopped from other schedulers, thread-local destructors, signals aimed at fibra's
//! threads, and exhausted resources (descriptors, threads, address space).

#[path = "../common/mod.rs"]
mod common;

mod fork;
mod nesting;
mod resource_exhaustion;
mod signals_and_descriptors;
mod signals_in_waits;
