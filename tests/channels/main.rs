//! Channels and `select!`: `mpsc`, `mpmc`, `oneshot`, `broadcast`, and selects over them,
//! including the offers a waiting select makes on rendezvous channels.

#[path = "../common/mod.rs"]
mod common;

mod broadcast;
mod conformance;
mod mpmc;
mod mpsc;
mod oneshot;
mod select;
mod select_offers;
