//! The N:M scheduler: where tasks run (pinning, spawning, a started fiber never changing
//! thread), `park` and `Unparker`, per-task options, fairness within cooperation, idle
//! workers that cost no CPU, `use_caller`, and the memory behind each task.

#[path = "../common/mod.rs"]
mod common;

mod basics;
mod fairness;
mod idle_cpu;
mod park;
mod task_memory;
mod task_options;
mod use_caller_drop;
