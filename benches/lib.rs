//! Criterion benchmarks of fibra alone: `cargo bench -p fibra-benches`. Each file is one
//! subject (the scheduler's core paths, `fibra::sync`, stacks, the timing wheel, the
//! blocking pool); the comparison with tokio, may, Go and std threads is the separate
//! harness in `benches/compare`. They live in a package of their own so that building
//! fibra's tests and examples does not compile criterion.
