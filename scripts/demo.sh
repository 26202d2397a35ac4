#!/usr/bin/env bash
# The main job. Until the qwen_gsm8k driver lands, it runs toy_dapo: the library's whole DAPO loop on a toy task.
# Arguments go to the program (toy_dapo --steps N --seed S).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/setup.sh toy_dapo
exec "${DAPO_BUILD_DIR:-build}/examples/toy_dapo/toy_dapo" "$@"
