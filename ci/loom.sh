#!/usr/bin/env bash
# Model-checks fibra::sync's atomic state machines (wait-queue node handshake, mutex word,
# oneshot slot, channel hand-overs) with loom: every interleaving of a few threads, up to
# LOOM_MAX_PREEMPTIONS preemptions per execution. About a minute on 2 cores: the build,
# then ~30 s of checking at the default bound of 5.
#
# The models live in src/sync/loom_model.rs; under --cfg loom, src/sync/shim.rs swaps the
# atomics, cells, internal lock and park for loom's. A separate target directory keeps the
# loom build from invalidating the normal one.
set -euo pipefail
cd "$(dirname "$0")/.."

export RUSTFLAGS="--cfg loom ${RUSTFLAGS:-}"
export LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-5}"
export CARGO_TARGET_DIR="${LOOM_TARGET_DIR:-target/loom}"

echo "== loom model checks (LOOM_MAX_PREEMPTIONS=$LOOM_MAX_PREEMPTIONS)"
# Extra arguments replace the default filter, e.g. `bash ci/loom.sh sync::loom_model::mutex`.
cargo test --lib --release -- --test-threads=2 "${@:-sync::loom_model}"
