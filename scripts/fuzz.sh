#!/usr/bin/env bash
# Fuzzing: builds the libFuzzer targets of tests/fuzz (clang, ASan + UBSan) and runs each for SECONDS (default 600)
# from its committed seeds (tests/fuzz/corpus/<target>) and seeds made from ../shared; prints a table (target,
# seconds, executions, result) and fails when any target found a crash, a hang, a leak or a sanitizer report.
# Usage: scripts/fuzz.sh [SECONDS] [TARGET...]   (CI: scripts/fuzz.sh 20). Findings: build-fuzz/findings/<target>/.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
seconds=${1:-600}
shift || true
build_dir=${DAPO_FUZZ_BUILD_DIR:-build-fuzz}
shared=${DAPO_SHARED_DIR:-../shared}
jobs=${DAPO_FUZZ_JOBS:-$(nproc)}

CC=clang CXX=clang++ DAPO_BUILD_DIR=$build_dir DAPO_PACKAGE_LISTS="scripts/packages.txt scripts/fuzz-packages.txt" \
  DAPO_EXTRA_CMAKE_ARGS="-DDAPO_FUZZ=ON -DDAPO_BUILD_TESTS=OFF -DDAPO_BUILD_BENCHMARKS=OFF -DDAPO_INSTALL=OFF
                         -DDAPO_ALLOCATOR=system -DDAPO_CUDA=OFF -DCMAKE_CXX_FLAGS=-g" \
  scripts/setup.sh fuzz_targets
if (($#)); then targets=("$@"); else
  mapfile -t targets < <(find tests/fuzz -name '*_fuzz.cpp' -printf '%f\n' | sed 's/_fuzz.cpp$//' | sort)
fi

seeds=$build_dir/shared-seeds
rm -rf "$seeds" && mkdir -p "$seeds"
if [[ -d $shared ]]; then
  python3 tests/fuzz/shared_seeds.py "$shared" "$seeds"
else
  echo "fuzz: $shared not found: the committed seeds only (set DAPO_SHARED_DIR for the reference data's)" >&2
fi
export DAPO_SHARED_DIR=$shared  # the text targets encode with the Qwen2.5 tokenizer from it

# One target: its new inputs go to $build_dir/corpus/<target> (kept between runs), its findings to findings/<target>/.
run_target() {
  local target=$1 work=$build_dir/corpus/$1 findings=$build_dir/findings/$1
  rm -rf "$findings"  # this run's findings only
  mkdir -p "$work" "$findings" "$seeds/$target"
  "$build_dir/tests/fuzz/${target}_fuzz" -max_total_time="$seconds" -timeout=25 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$findings/" "$work" "tests/fuzz/corpus/$target" "$seeds/$target" \
    > "$build_dir/logs/$target.log" 2>&1
}
mkdir -p "$build_dir/logs"
running=0
for target in "${targets[@]}"; do
  [[ -x $build_dir/tests/fuzz/${target}_fuzz ]] || { echo "fuzz: no target $target" >&2; exit 2; }
  run_target "$target" &
  if ((++running >= jobs)); then wait -n || true; ((running--)); fi
done
wait || true

failed=0
report=$build_dir/fuzz-report.md
{
  echo "| target | seconds | executions | corpus | result |"
  echo "|---|---:|---:|---:|---|"
  for target in "${targets[@]}"; do
    log=$build_dir/logs/$target.log
    executions=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    corpus=$(find "$build_dir/corpus/$target" -type f | wc -l)
    if grep -q '^Done [0-9]* runs' "$log" && ! ls "$build_dir/findings/$target"/* > /dev/null 2>&1; then
      result="0 crashes, 0 hangs, 0 sanitizer reports"
    else
      result="FINDING: $({ grep -m1 -E 'ERROR: |FINDING: |==ERROR|runtime error' "$log" || true; } | cut -c1-120) (see $log)"
      failed=1
    fi
    echo "| $target | $seconds | ${executions:-?} | $corpus | $result |"
  done
} | tee "$report"
exit $failed
