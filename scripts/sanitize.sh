#!/usr/bin/env bash
# The tests under AddressSanitizer + UndefinedBehaviorSanitizer (GCC, -O1 without debug information, CMake's
# DAPO_SANITIZE=ON) in their own build directory, ${DAPO_SANITIZE_BUILD_DIR:-build-sanitize}; extra arguments go to
# ctest. --ci: the library, text and model tests only (not the trainer's, the CLI's or the multi-process ones).
# Suppressions: scripts/sanitizers/.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ci=0
if [[ ${1:-} == --ci ]]; then ci=1; shift; fi
export DAPO_BUILD_DIR=${DAPO_SANITIZE_BUILD_DIR:-build-sanitize}
# -O1: a usable speed; no -g, so the stacks name functions, not lines. Asserts stay on (no
# -DNDEBUG). The system malloc, because tcmalloc would take malloc away from ASan. No -Werror: with -fsanitize=address
# GCC 12 warns -Wmaybe-uninitialized inside <regex> (false positives; scripts/test.sh checks that the normal build is
# warning-free). No benchmarks: they are not tests.
export DAPO_WERROR=OFF
export DAPO_EXTRA_CMAKE_ARGS="-DDAPO_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1
  -DDAPO_ALLOCATOR=system -DDAPO_BUILD_BENCHMARKS=OFF ${DAPO_EXTRA_CMAKE_ARGS:-}"
supp=$PWD/scripts/sanitizers
export ASAN_OPTIONS="halt_on_error=1:abort_on_error=0:detect_leaks=1:print_stacktrace=1:suppressions=$supp/asan.supp"
export LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:suppressions=$supp/ubsan.supp"
# OpenBLAS's idle workers spin on sched_yield; on 2 cores, with ASan slowing the thread that feeds them, that spinning
# took half the time of the slowest test (trainer_test's off-policy clip: 786 s, 395 s with one BLAS thread).
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
if ((ci)); then
  scripts/setup.sh dapo_core_tests dapo_torch_tests qwen_text_tests qwen_model_tests
  ctest --test-dir "$DAPO_BUILD_DIR" --output-on-failure -R '^(core|torch|qwen_text|qwen_model)$' "$@"
else
  # Not here: torchrun (Python's torchrun starting a sanitized program would need libasan preloaded into Python) and
  # consumer_* (throwaway projects that build without the sanitizer flags: packaging checks, scripts/test.sh runs them).
  scripts/setup.sh
  ctest --test-dir "$DAPO_BUILD_DIR" --output-on-failure -E '^(consumer_.*|torchrun)$' "$@"
fi
