#![cfg(feature = "hook")]
//! The fuzz targets' committed corpus (`fuzz/corpus/<target>/`), replayed through the same
//! differential driver the targets use (`differential`): every program must give the C
//! library's results with the hooks, on a plain thread and in a fiber. This keeps the
//! corpus a regression suite on the stable toolchain; the fuzzing itself needs nightly
//! (`docs/hooks.md`, "Differential fuzzing").
//!
//! Each target replays in a child process: the driver takes the fd numbers from 100 up and
//! fills the free ones below, which tests running beside it in one process would disturb.

use std::path::PathBuf;

use crate::common::child_ok;
use crate::differential::{check, Target};

/// The corpus files of `name`, in a stable order.
fn corpus(name: &str) -> Vec<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(name);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no corpus in {}", dir.display());
    files
}

fn replay(name: &str, target: Target) {
    child_ok(|| {
        let (mut made, mut skipped) = (0, 0);
        for f in corpus(name) {
            let data = std::fs::read(&f).unwrap();
            let (m, s) = check(target, &data).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
            made += m;
            skipped += s;
        }
        // A corpus whose programs the reference mostly refuses tests little.
        assert!(
            made > 4 * skipped,
            "{name}: {made} operations made, {skipped} skipped"
        );
    });
}

#[test]
fn poll_select_corpus_matches_libc() {
    replay("poll_select", Target::PollSelect);
}

#[test]
fn vectored_corpus_matches_libc() {
    replay("vectored", Target::Vectored);
}

#[test]
fn fd_modes_corpus_matches_libc() {
    replay("fd_modes", Target::FdModes);
}

#[test]
fn dup_close_corpus_matches_libc() {
    replay("dup_close", Target::DupClose);
}
