//! Channels and `select!`: `mpsc`, `mpmc`, `oneshot`, `broadcast`, and selects over them,
//! including the offers a waiting select makes on rendezvous channels; and property tests
//! of every kind against a sequential model.

#[path = "../common/mod.rs"]
mod common;
#[path = "../common/props.rs"]
mod props_common;

mod broadcast;
mod conformance;
mod mpmc;
mod mpsc;
mod oneshot;
mod props;
mod select;
mod select_offers;
