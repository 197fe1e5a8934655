//! Differential fuzzing of the hooks: see `tests/hooks/differential`.
#![no_main]

#[path = "../../tests/hooks/differential/mod.rs"]
mod differential;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Err(e) = differential::check(differential::Target::FdModes, data) {
        panic!("{e}");
    }
});
