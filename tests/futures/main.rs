//! `fibra::future`: async code in fibers and fibra's handles and channels awaited from async
//! code, and the bridge misused.

#[path = "../common/mod.rs"]
mod common;

mod bridge;
mod misuse;
mod tokio_context;
