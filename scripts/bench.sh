#!/usr/bin/env bash
# The microbenchmarks: builds them (Release) and runs each; every one checks its result against the reference before
# timing. Prints the tables and writes JSON to ${DAPO_BUILD_DIR:-build}/bench-results/. Extra arguments go to the
# benchmarks (e.g. --threads 2). DAPO_NATIVE=ON compiles them for this CPU (-march=native).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
build_dir=${DAPO_BUILD_DIR:-build}
DAPO_EXTRA_CMAKE_ARGS="-DDAPO_NATIVE=${DAPO_NATIVE:-OFF}" scripts/setup.sh loss_bench logprob_bench
results="$build_dir/bench-results"
mkdir -p "$results"
"$build_dir/benchmarks/loss_bench" --json "$results/loss_bench.json" "$@"
echo
"$build_dir/benchmarks/logprob_bench" --json "$results/logprob_bench.json" "$@"
