//! Fibers and their stacks: the standalone coroutine, stacks from the pool at scale and at
//! their limits, guard pages and the overflow report, the smallest stack, and the panic hook.

#[path = "../common/mod.rs"]
mod common;

mod min_stack;
mod overflow;
mod panic_hook;
mod spare_stacks;
mod stack_limits;
mod stacks_at_scale;
mod standalone;
mod standalone_stacks;
