#!/usr/bin/env bash
# The transformers leg: our model, checkpoints, generation, sampler, tokenizer and chat template against Hugging Face
# transformers 5, tokenizers and Jinja2 themselves, run on the CPU in the Debian sid root (scripts/libtorch2.sh sid
# python; the root holds scripts/transformers-packages.txt). Our side is this machine's build (the Debian 12 build of
# CI's first leg; built here when missing). Each part fails on a mismatch (docs/platforms.md):
#   a. drift: tests/fixtures/transformers_golden.py's model made afresh by the root's transformers passes the model test
#   b. transformers to ours: models transformers made and saved in five configurations, through the same model test
#   c. ours to transformers: checkpoints of `qwen_gsm8k train` (float32, bfloat16, sharded) and of the demo (its
#      in-memory tokenizer written beside the weights) loaded by transformers; `qwen_gsm8k generate` on the demo's
#      checkpoint with fewer slots than prompts against transformers' generate() on the same conversations
#   d. generate() and the logits processors against qwen::generate and our sampler (and a chi-square of its draws)
#   e. 20,000 generated strings through tokenizers and ours; f. 500 generated conversations through apply_chat_template
# A failing part leaves its cases in build/transformers-check/refs/*_mismatches.json. The generated strings and
# conversations are new in every run; DAPO_FUZZ_SEED=S repeats a run's (it prints its seed).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
build=${DAPO_BUILD_DIR:-build}
shared=$(realpath -m "${DAPO_SHARED_DIR:-../shared}")
work=$build/transformers-check  # relative to the clone: the same path in the root (/src) and here
started=$SECONDS
step() { echo "transformers-check: $1 ($((SECONDS - started)) s)"; }
[[ -d $shared ]] || { echo "transformers-check: $shared (the tokenizer fixture, GSM8K) is missing; set DAPO_SHARED_DIR" >&2; exit 1; }

bash scripts/setup.sh qwen_gsm8k qwen_model_tests transformers_model_tests transformers_text_tests > /dev/null
rm -rf "$work"
mkdir -p "$work"
step "our programs built"
seed=()
[[ -n ${DAPO_FUZZ_SEED:-} ]] && seed=(--seed "$DAPO_FUZZ_SEED")
bash scripts/libtorch2.sh sid python tests/transformers/references.py models "$work/refs" "${seed[@]}" \
  > "$work/models.json" 2> "$work/models.log" || { cat "$work/models.log" >&2; exit 1; }
step "transformers' references made: $(cat "$work/models.json")"

# c. Our trainer, from transformers' random model with the Qwen2.5 tokenizer: a few GRPO steps, then a checkpoint.
train() {
  "$build/examples/qwen_gsm8k/qwen_gsm8k" train --model "$work/refs/initial" --output "$work/$1" \
    --train "$shared/data/gsm8k/train.jsonl" --algo grpo --steps 2 --train-batch-size 2 --ppo-mini-batch-size 2 \
    --rollout-n 2 --max-new-tokens 8 --eval-problems 0 --log-rollouts 0 --logger jsonl --quiet "${@:2}" \
    > "$work/$1.log" 2>&1 || { cat "$work/$1.log" >&2; return 1; }
  echo "$work/$1/checkpoints/$(cat "$work/$1/checkpoints/latest")"
}
checkpoints=()
checkpoints+=("$(train float32)")
checkpoints+=("$(train bfloat16 --dtype bfloat16 --allow-bf16-weights)")
checkpoints+=("$(train sharded --max-shard-size 2MB)")
# The demo's: a short warm start and one GRPO step (no dynamic sampling to wait for), then its final checkpoint.
"$build/examples/qwen_gsm8k/qwen_gsm8k" demo --algo grpo --output "$work/demo" --sft-steps 50 --sft-min-steps 50 \
  --steps 1 --eval-problems 4 --quiet > "$work/demo.log" 2>&1 || { cat "$work/demo.log" >&2; exit 1; }
demo=$work/demo/checkpoints/$(cat "$work/demo/checkpoints/latest")
checkpoints+=("$demo")
step "our trainer's checkpoints written: ${checkpoints[*]}"
generate_tokens=24
bash scripts/libtorch2.sh sid python tests/transformers/references.py checkpoints "$work/refs" "${checkpoints[@]}" \
  --generate "$demo" --generate-tokens $generate_tokens > /dev/null 2> "$work/checkpoints.log" ||
  { cat "$work/checkpoints.log" >&2; exit 1; }
step "transformers read our checkpoints"
# The held-out check's shape: 3 sequence slots for 12 conversations (tests/transformers/generation_test.cpp compares).
"$build/examples/qwen_gsm8k/qwen_gsm8k" generate --model "$demo" --input "$work/refs/generate_input.jsonl" \
  --output "$work/refs/generate_ours.jsonl" --max-num-seqs 3 --max-new-tokens $generate_tokens \
  > "$work/generate.log" 2>&1 || { cat "$work/generate.log" >&2; exit 1; }
step "qwen_gsm8k generate on the demo's checkpoint"

status=0
goldens=$(printf '%s:' "$PWD/$work/refs/drift" "$PWD/$work"/refs/configs/*)
DAPO_TRANSFORMERS_GOLDENS=${goldens%:} DAPO_SHARED_DIR=$shared "$build/tests/qwen_model_tests" \
  --test-case='*transformers*' || status=1
step "a, b: the model test on transformers' models"
export DAPO_TRANSFORMERS_REFERENCES=$PWD/$work/refs DAPO_SHARED_DIR=$shared
"$build/tests/transformers_model_tests" || status=1
step "c, d: checkpoints, generation and sampling"
"$build/tests/transformers_text_tests" || status=1
step "e, f: tokenizer and chat template"
((status == 0)) || echo "transformers-check: failed; mismatching cases are in $work/refs/*_mismatches.json" >&2
exit $status
