#!/usr/bin/env bash
# The benchmarks: builds them (Release) and runs the ones named (default: all) — loss, logprob, tokenizer, model, step,
# ops (operators per decode step and training forward: benchmarks/ops_bench.cpp), shared (the update with each group's
# prompt once, against each row whole: benchmarks/shared_prompt_bench.cpp), python (torch.ops.dapo from Debian's
# python3-torch against PyTorch ops: benchmarks/python_ops_bench.py).
# Every benchmark checks its result against a reference before timing. Prints tables and writes JSON to
# ${DAPO_BUILD_DIR:-build}/bench-results/. DAPO_NATIVE=ON compiles them for this CPU (-march=native).
# The model benchmark writes a random 2 GB Qwen2.5-0.5B-shaped checkpoint to /tmp once and takes a few minutes.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
build_dir=${DAPO_BUILD_DIR:-build}
shared=${DAPO_SHARED_DIR:-../shared}
benchmarks=("$@")
((${#benchmarks[@]})) || benchmarks=(loss logprob tokenizer model step ops shared python)
targets=()
for name in "${benchmarks[@]}"; do
  case "$name" in
    python) targets+=(dapo_torch_ops) ;;
    shared) targets+=(shared_prompt_bench) ;;
    *) targets+=("${name}_bench") ;;
  esac
done
lists=scripts/packages.txt
[[ " ${benchmarks[*]} " == *" python "* ]] && lists+=" scripts/python-packages.txt"  # python3-torch
DAPO_PACKAGE_LISTS=$lists DAPO_EXTRA_CMAKE_ARGS="-DDAPO_NATIVE=${DAPO_NATIVE:-OFF}" scripts/setup.sh "${targets[@]}"
results="$build_dir/bench-results"
mkdir -p "$results"
for name in "${benchmarks[@]}"; do
  echo
  case "$name" in
    tokenizer)
      "$build_dir/benchmarks/tokenizer_bench" --tokenizer "$shared/fixtures/tokenizer/qwen2.5" \
        --data "$shared/data/gsm8k/train.jsonl" --json "$results/tokenizer_bench.json" ;;
    step)  # the demo's step, then a model with Qwen2.5's vocabulary
      "$build_dir/benchmarks/step_bench" --shape demo --prompts 32 --rollout-n 8 --mini 16 \
        --json "$results/step_bench_demo.json"
      "$build_dir/benchmarks/step_bench" --tokenizer "$shared/fixtures/tokenizer/qwen2.5" \
        --json "$results/step_bench.json" ;;
    python)  # Debian's python3, whose torch is the LibTorch the ops link
      PYTHONPATH="$build_dir/python" /usr/bin/python3 benchmarks/python_ops_bench.py | tee "$results/python_ops_bench.md" ;;
    ops)  # operators per decode step and per training forward at Qwen2.5-1.5B's layer graph, float32 and bfloat16
      "$build_dir/benchmarks/ops_bench" --autocast none --json "$results/ops_bench_float32.json"
      "$build_dir/benchmarks/ops_bench" --json "$results/ops_bench_bfloat16.json" ;;
    shared)  # G = 4, 8, 16 at the seed's GSM8K prompt length, two of the 1.5B's layers
      "$build_dir/benchmarks/shared_prompt_bench" --json "$results/shared_prompt_bench.json" ;;
    loss | logprob | model)
      "$build_dir/benchmarks/${name}_bench" --json "$results/${name}_bench.json" ;;
    *)
      echo "bench.sh: unknown benchmark '$name' (expected loss, logprob, tokenizer, model, step, ops, shared or python)" >&2
      exit 2 ;;
  esac
done
