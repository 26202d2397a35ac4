#!/usr/bin/env bash
# The tests: installs what is missing, builds everything, runs every test with CTest. Extra arguments go to ctest
# (e.g. scripts/test.sh -R core). Tests that need ../shared skip with a message when it is absent.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# The torchrun test (tests/qwen/torchrun_test.cpp) needs Debian's python3-torch, a test-only package
# (scripts/test-packages.txt): installed here, and then required, so that a missing torchrun fails instead of skipping.
# DAPO_TORCHRUN_TEST=optional (the LibTorch 2.x leg, whose Debian 13 root lacks it) neither installs nor requires it.
export DAPO_TORCHRUN_TEST=${DAPO_TORCHRUN_TEST:-required}
if [[ $DAPO_TORCHRUN_TEST == required ]]; then
  DAPO_PACKAGE_LISTS="scripts/packages.txt scripts/test-packages.txt" scripts/setup.sh
else
  scripts/setup.sh
fi
# As many tests at a time as there are cores (two here: the consumer projects compile one file each while the trainer
# tests run); tests that share a resource say so (RESOURCE_LOCK in tests/CMakeLists.txt).
ctest --test-dir "${DAPO_BUILD_DIR:-build}" --output-on-failure --parallel "$(nproc)" "$@"
