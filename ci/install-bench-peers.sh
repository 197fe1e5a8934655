#!/bin/sh
# Installs the non-Rust peers of the fibra-compare benchmark (benches/compare): Debian's Go
# toolchain (the Go peer) and wrk (the http load generator). Needs root. Without them the
# benchmark still runs and reports Go and http as skipped.
set -eu
apt-get update
apt-get install -y golang-go wrk
