#!/usr/bin/env bash
# The main job: the built-in DAPO demo of the qwen_gsm8k driver (tiny Qwen2 model, byte-level tokenizer, generated
# GSM8K-style problems; a supervised warm start, then DAPO). Needs no files; takes a few minutes on 2 cores.
# Arguments go to `qwen_gsm8k demo` (output: demo-output/ unless --output); e.g. scripts/demo.sh --seed 2 --algo grpo.
# --overwrite: running it again replaces the previous run in that directory (the program alone refuses to).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/setup.sh qwen_gsm8k
exec "${DAPO_BUILD_DIR:-build}/examples/qwen_gsm8k/qwen_gsm8k" demo --overwrite "$@"
