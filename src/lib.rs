//! fibra
