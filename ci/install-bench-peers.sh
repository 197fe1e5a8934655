#!/bin/sh
# Installs the non-Rust peers of the fibra-compare benchmark (benches/compare): Debian's Go
# toolchain (the Go peer), wrk (the http load generator) and redis-server (the server of the
# redis_get workload). Needs root. Without them the benchmark still runs and reports Go, the
# http workloads and redis_get as skipped.
set -eu
apt-get update
apt-get install -y golang-go wrk redis-server
