#!/usr/bin/env bash
# Runs the same checks as CI (.ci/run) from a developer's checkout.
set -euo pipefail
exec bash "$(dirname "$0")/../.ci/run"
