#!/usr/bin/env bash
# The checks every submission must pass: formatting, lints, docs, the test suite (the README's
# test command, which includes the doctests), loom model checks, and the benchmarks compiled
# and run once.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo >/dev/null 2>&1; then
    echo "cargo is required (install Rust with rustup)" >&2
    exit 1
fi
rustup component add rustfmt clippy >/dev/null 2>&1 || true

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy --all-targets -- -D warnings"
cargo clippy --all-targets -- -D warnings

echo "== cargo doc (broken links are errors)"
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps

echo "== cargo test (unit, integration and doc tests)"
cargo test

echo "== examples: the echo server's bounded self-test"
cargo run --release --example echo_server -- --selftest

echo "== loom model checks of fibra::sync"
bash ci/loom.sh

echo "== benchmarks compile and run once"
cargo bench -- --test
