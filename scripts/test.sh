#!/usr/bin/env bash
# The tests: installs what is missing, builds everything, runs every test with CTest. Extra arguments go to ctest
# (e.g. scripts/test.sh -R core). Tests that need ../shared skip with a message when it is absent.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/setup.sh
ctest --test-dir "${DAPO_BUILD_DIR:-build}" --output-on-failure "$@"
