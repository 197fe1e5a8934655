#!/usr/bin/env bash
# Model-checks fibra's atomic state machines with loom: the scheduler's (park word, idle
# protocol, remote wake against free; src/sched/loom_model.rs) and fibra::sync's (wait-queue
# node handshake, mutex word, oneshot slot, channel hand-overs; src/sync/loom_model.rs): every interleaving of a few threads, up to
# LOOM_MAX_PREEMPTIONS preemptions per execution. About a minute on 2 cores: the build,
# then ~30 s of checking at the default bound of 5.
#
# Under --cfg loom, src/sync/shim.rs swaps sync's atomics, cells, internal lock and park for
# loom's; the scheduler's park word, idle set, parker and waker count use loom's atomics. A separate target directory keeps the
# loom build from invalidating the normal one.
set -euo pipefail
cd "$(dirname "$0")/.."

export RUSTFLAGS="--cfg loom ${RUSTFLAGS:-}"
export LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-5}"
export CARGO_TARGET_DIR="${LOOM_TARGET_DIR:-target/loom}"

echo "== loom model checks (LOOM_MAX_PREEMPTIONS=$LOOM_MAX_PREEMPTIONS)"
# Extra arguments replace the default filter, e.g. `bash ci/loom.sh sync::loom_model::mutex`.
cargo test --lib --release -- --test-threads=2 "${@:-loom_model}"
