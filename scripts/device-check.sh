#!/usr/bin/env bash
# The GPU machine's two commands (docs/benchmarks.md, "On a GPU machine"), each ending well inside the device tool's
# 10-minute limit. On one NVIDIA GPU with PyTorch's LibTorch (python3 -c 'import torch'), transformers and nvcc, and
# device-carry/ from scripts/device-prepare.sh beside it, it unpacks the carried Debian packages, builds against
# PyTorch's LibTorch, then runs its stages:
#   headline   the first call on a cold machine (about 6 minutes, its build included): builds only qwen_gsm8k and the
#              three programs it runs, then
#     generate   the generation engine's decode at the Qwen2.5-1.5B shape in bfloat16 (batch 64, prompt 256, 128 new
#                tokens): eager and CUDA-graph steps, prefill, decode ms per step, tokens/s, peak memory, the fraction
#                of this card's bandwidth bound (measured by a copy); transformers' generate() on the same shape
#     train      the seed's DAPO step through `qwen_gsm8k train` at that shape (random weights, --load-format dummy;
#                the real tokenizer; GSM8K's train lines; dynamic sampling on, --dummy-accuracy 0.7), 3 steps: its
#                timing_s/* and perf/* metrics and its memory plan
#     profile    LibTorch's profiler (Kineto) over decode steps (eager and graphs), admissions, an update micro-batch
#                and an optimizer step (benchmarks/profile_bench): kernels per step, the 15 top kernels, GPU busy time
#                against wall time
#   rest       the second call, on the same warm machine (or a fresh one: it builds what is missing): the rest of the
#              build, then
#     fixture    this machine's transformers makes a tiny random Qwen2 model and its outputs, as the committed
#                tests/fixtures/transformers was made in the sid root (build-device/transformers-fixture)
#     cuda_tests the CUDA and transformers test cases, their measured differences kept for the report
#     step       step_bench at a larger, verl-like scale; the update with each group's prompt computed once against
#                each row whole (shared_prompt_bench)
#     checkpoint a short demo on the GPU saves a checkpoint; transformers loads it (from_pretrained) and its outputs on
#                it become a golden that our model must reproduce
#     demo       the built-in demo on the GPU: accuracy before/after, wall time
#     tests      the whole test suite (ctest), last: what is left of the budget
# After every stage the report is written anew into OUT (report.md, one Markdown table; results.json, every record;
# profile.md, the profile's tables; log.txt, the whole output as it goes), so a command stopped at its limit still
# brings back every stage that finished before it.
#
#   scripts/device-check.sh [headline|rest] [--dry-run] [--stages a,b,...] [--budget SECONDS] [--build-dir DIR]
#                           [--kill-after STAGE] [OUT]                      (OUT defaults to $OUT, else build-device/out)
#   headline|rest  the call (default headline)
#   --dry-run      here, on the CPU with Debian's LibTorch: the same stages at tiny sizes, CUDA parts skipped,
#                  transformers parts skipped when it is not importable; the build sees the carried packages only
#                  (the system's copies are hidden in a private mount namespace)
#   --build-dir    take the programs from a build made elsewhere (CI's Debian 12 build): no configure, no build, no
#                  isolation; with --dry-run only
#   --kill-after   kill this script with SIGKILL once STAGE's results are written, as the device tool kills a command
#                  at its limit (the dry run's check that OUT keeps what landed before)
#   --unpack-only  unpack device-carry/ into build-device/prefix and check it (CI runs this)
#   --stages       run only these stages of the call (deps always)
#   --budget       seconds for everything (default: headline 360, rest 420; 3600 with --dry-run): each stage gets at
#                  most what is left, stages that no longer fit are reported as skipped, so the command returns
# Each stage runs under a time limit and may fail without stopping the others; the report says which did what.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
call=headline
headline_stages=deps,build,generate,train,profile
rest_stages=deps,build,fixture,cuda_tests,step,checkpoint,demo,tests
stages=
dry_run=0
unpack_only=0
budget=
build_dir=
kill_after=
out=${OUT:-}
while (($#)); do
  case $1 in
    headline | rest) call=$1 ;;
    --dry-run) dry_run=1 ;;
    --unpack-only) unpack_only=1 ;;
    --stages) stages=deps,$2; shift ;;
    --budget) budget=$2; shift ;;
    --build-dir) build_dir=$(cd "$2" && pwd) || { echo "device-check: no build folder $2" >&2; exit 2; }; shift ;;
    --kill-after) kill_after=$2; shift ;;
    -h | --help) awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0"; exit 0 ;;
    -*) echo "device-check: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) out=$1 ;;
  esac
  shift
done
all_stages=$([[ $call == headline ]] && echo "$headline_stages" || echo "$rest_stages")
stages=${stages:-$all_stages}
if [[ -z $budget ]]; then  # a cold build here takes many minutes on 2 cores
  if ((dry_run)); then budget=3600; elif [[ $call == headline ]]; then budget=360; else budget=420; fi
fi
for stage in ${stages//,/ } ${kill_after}; do
  [[ ,$all_stages, == *,$stage,* ]] || { echo "device-check: the $call call has no stage $stage (its stages: $all_stages)" >&2; exit 2; }
done
if [[ -n $build_dir ]] && ((!dry_run)); then
  echo "device-check: --build-dir is for --dry-run (the GPU machine builds against PyTorch's LibTorch)" >&2
  exit 2
fi

work=$root/build-device
carry=$root/device-carry
prefix=$work/prefix
build=${build_dir:-$work/cmake}
results=$work/results
out=${out:-$work/out}
shared=$carry/shared
[[ -d $shared/fixtures ]] || shared=${DAPO_SHARED_DIR:-$root/../shared}  # a dry run without device-prepare.sh
export root work carry prefix build build_dir results out shared dry_run call

# --- the carried packages ---------------------------------------------------------------------------------------
unpack_deb() {  # dpkg-deb where it exists; else the .deb's data archive with ar and tar
  if command -v dpkg-deb >/dev/null; then
    dpkg-deb -x "$1" "$prefix"
  else
    local member
    member=$(ar t "$1" | grep '^data\.tar')
    ar p "$1" "$member" | tar -x -C "$prefix" --auto-compress -f - 2>/dev/null ||
      ar p "$1" "$member" | tar -x -C "$prefix" -I "$(case $member in *.zst) echo zstd -d ;; *.xz) echo xz -d ;; *) echo gzip -d ;; esac)"
  fi
}

stage_deps() {
  [[ -z $build_dir ]] || { echo "skipped: the programs come from $build_dir"; return 3; }
  compgen -G "$carry/debs/*.deb" >/dev/null || { echo "no $carry/debs: run scripts/device-prepare.sh first"; return 1; }
  rm -rf "$prefix"
  mkdir -p "$prefix/bin"
  local deb
  for deb in "$carry"/debs/*.deb; do unpack_deb "$deb" || { echo "cannot unpack $deb"; return 1; }; done
  # pkg-config files name /usr: point them into the prefix.
  find "$prefix" -name '*.pc' -exec sed -i "s#=/usr\(/\|\$\)#=$prefix/usr\1#g" {} +
  local lib=$prefix/usr/lib/x86_64-linux-gnu
  cat >"$prefix/bin/pkg-config" <<EOF
#!/bin/sh
# The carried pkgconf, seeing only the carried .pc files.
LD_LIBRARY_PATH="$lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" PKG_CONFIG_LIBDIR="$lib/pkgconfig:$prefix/usr/share/pkgconfig" exec "$prefix/usr/bin/pkgconf" "\$@"
EOF
  chmod +x "$prefix/bin/pkg-config"
  local flags
  flags=$("$prefix/bin/pkg-config" --cflags --libs libpcre2-8 libutf8proc) || { echo "carried pkg-config fails"; return 1; }
  [[ $flags == *"-I$prefix/usr/include"* || $flags == *"-L$lib"* ]] || { echo "pkg-config flags outside the prefix: $flags"; return 1; }
  local header
  for header in nlohmann/json.hpp doctest/doctest.h CLI/CLI.hpp eigen3/Eigen/Core pcre2.h utf8proc.h gloo/algorithm.h; do
    [[ -f $prefix/usr/include/$header ]] || { echo "carried packages lack $header"; return 1; }
  done
  echo "unpacked $(ls "$carry"/debs/*.deb | wc -l) packages into $prefix; pkg-config: $flags"
  [[ -d $shared/fixtures ]] || echo "warning: no $shared: tests that need the reference data skip"
}

# --- the build --------------------------------------------------------------------------------------------------
# What each call builds: the headline only what its stages run (the driver compiles in parallel with the three
# benchmarks); the rest everything its stages and the test suite need.
headline_targets=(qwen_gsm8k generate_bench profile_bench dummy_model_dir)
rest_targets=(dapo_core_tests dapo_torch_tests qwen_text_tests qwen_model_tests qwen_train_tests checkpoint_writer
              distributed_worker launcher_worker qwen_gsm8k generate_bench step_bench shared_prompt_bench profile_bench
              dummy_model_dir dapo_kernel_abi_test dapo_torch_ops)
export headline_targets_list="${headline_targets[*]}" rest_targets_list="${rest_targets[*]}"

stage_build() {
  local wanted
  read -r -a wanted <<<"$([[ $call == headline ]] && echo "$headline_targets_list" || echo "$rest_targets_list")"
  if [[ -n $build_dir ]]; then  # a build made elsewhere: the call's programs must be there
    local missing=() target
    for target in qwen_gsm8k generate_bench profile_bench dummy_model_dir step_bench shared_prompt_bench; do
      [[ -x $(bin "$(target_path "$target")") ]] || missing+=("$target")
    done
    ((${#missing[@]} == 0)) || { echo "$build_dir lacks ${missing[*]}"; return 1; }
    echo "skipped: the programs come from $build_dir"
    return 3
  fi
  local generator=() cmake_args=() jobs
  jobs=$(nproc)
  command -v ninja >/dev/null && generator=(-G Ninja)
  [[ -f $build/CMakeCache.txt ]] && generator=()  # keep the generator of an earlier try
  cmake_args=(-DCMAKE_BUILD_TYPE=Release -DDAPO_ALLOCATOR=system -DCMAKE_POLICY_VERSION_MINIMUM=3.5
              "-DPKG_CONFIG_EXECUTABLE=$prefix/bin/pkg-config")
  if ((dry_run)); then
    cmake_args+=("-DCMAKE_PREFIX_PATH=$prefix/usr" -DDAPO_CUDA=OFF)
    command -v ccache >/dev/null && cmake_args+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  else
    local torch_prefix site nccl rpath_dirs nvcc
    torch_prefix=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)') || return 1
    site=$(python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
    nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
    # PyTorch's wheel links the NVIDIA libraries of its pip packages (found at run time through its RUNPATH): the
    # linker is shown where they are, and nccl.h (ProcessGroupNCCL.hpp includes it) comes from there too.
    rpath_dirs=$(find "$site/nvidia" "$site/torch/lib" -name 'lib*.so*' -printf '%h\n' 2>/dev/null | sort -u | paste -sd:)
    nccl=$(find "$site/nvidia" -name nccl.h -printf '%h\n' 2>/dev/null | head -1)
    [[ -f $site/torch/include/gloo/algorithm.h ]] && echo "gloo headers: PyTorch's" ||
      echo "gloo headers: Debian 12's libgloo-dev (PyTorch's wheel has none)"
    # The Python tests (ctest's python) run with this python3, whose torch the ops are built against.
    cmake_args+=("-DCMAKE_PREFIX_PATH=$prefix/usr;$torch_prefix" "-DCMAKE_CUDA_COMPILER=$nvcc"
                 "-DDAPO_PYTHON=$(command -v python3)"
                 "-DCMAKE_EXE_LINKER_FLAGS=${rpath_dirs:+-Wl,-rpath-link,$rpath_dirs }-Wl,--allow-shlib-undefined"
                 ${nccl:+"-DCMAKE_CXX_FLAGS=-isystem $nccl" "-DCMAKE_CUDA_FLAGS=-isystem $nccl"})
  fi
  echo "cmake ${cmake_args[*]}"
  cmake -S "$root" -B "$build" "${generator[@]}" "${cmake_args[@]}" >"$work/configure.log" 2>&1 || {
    tail -40 "$work/configure.log"; return 1; }
  grep -E '^-- dapo:|Found Torch|CUDA' "$work/configure.log" | head -20
  local targets=() target
  for target in "${wanted[@]}"; do  # those this configuration has (dapo_kernel_abi_test needs nvcc)
    find "$build" -type d -name "$target.dir" -path '*CMakeFiles*' | grep -q . && targets+=("$target")
  done
  echo "building ${targets[*]} with -j$jobs"
  local keep_going=(-- -k)  # build what can be built: the stages that need it still run
  [[ -f $build/build.ninja ]] && keep_going=(-- -k 0)
  cmake --build "$build" -j"$jobs" --target "${targets[@]}" "${keep_going[@]}" >"$work/build.log" 2>&1 || {
    grep -E 'error|Error' "$work/build.log" | head -40; tail -20 "$work/build.log"; return 1; }
  if ((dry_run)); then  # the driver must take the carried libraries, not the system's
    local libs
    libs=$(ldd "$build/examples/qwen_gsm8k/qwen_gsm8k" | grep -E 'libpcre2-8\.|libutf8proc\.')
    echo "$libs"
    if grep -v "$prefix" <<<"$libs" | grep -q .; then echo "linked outside the carried prefix"; return 1; fi
  fi
}

# Probed once before the stages (importing torch and transformers takes seconds of the GPU budget each time).
have_transformers() { ((transformers_importable)); }
have_cuda() { ((!dry_run && cuda_available)); }
bin() { echo "$build/$1"; }
target_path() {  # a program's path in the build folder
  case $1 in
    qwen_gsm8k) echo examples/qwen_gsm8k/qwen_gsm8k ;;
    *_bench | dummy_model_dir) echo "benchmarks/$1" ;;
  esac
}

# --- stages -----------------------------------------------------------------------------------------------------
stage_fixture() {
  have_transformers || { echo "skipped: transformers is not importable here"; return 3; }
  local dir=$work/transformers-fixture
  rm -rf "$dir" && mkdir -p "$dir"
  python3 "$root/tests/fixtures/transformers_golden.py" new "$dir" | tee "$results/fixture.json"
}

stage_tests() {
  local exclude='consumer'  # the install + find_package projects: minutes, and nothing about the GPU
  if ((dry_run)); then  # the quick ones; the model suite's CUDA and golden cases run in cuda_tests
    DAPO_SHARED_DIR=$shared ctest --test-dir "$build" --output-on-failure -R '^(core|torch|qwen_text)$'
  else
    DAPO_SHARED_DIR=$shared ctest --test-dir "$build" --output-on-failure -j4 -E "$exclude" --timeout 400
  fi
}

stage_cuda_tests() {
  local status=0
  DAPO_SHARED_DIR=$shared "$(bin tests/dapo_torch_tests)" -tc='*CUDA*' || status=1
  # The committed transformers fixture, and the one this machine's transformers made (stage fixture) when there is one.
  local goldens=""
  [[ -f $work/transformers-fixture/expected.json ]] && goldens=$work/transformers-fixture
  DAPO_TRANSFORMERS_GOLDENS=$goldens DAPO_SHARED_DIR=$shared "$(bin tests/qwen_model_tests)" \
    -tc='*CUDA*,*transformers*,*tiny checkpoints*' |
    tee "$results/cuda_tests.txt" || status=1
  DAPO_SHARED_DIR=$shared "$(bin tests/qwen_train_tests)" -tc='*CUDA*,*transformers*' |
    tee -a "$results/cuda_tests.txt" || status=1
  # torch.ops.dapo from Python (tests/python): each test that takes a device runs on CUDA too where torch sees a GPU.
  DAPO_SHARED_DIR=$shared ctest --test-dir "$build" --output-on-failure -R '^python$' |
    tee -a "$results/cuda_tests.txt" || status=1
  return $status
}

stage_generate() {
  if have_cuda; then
    "$(bin benchmarks/generate_bench)" --shape qwen2.5-1.5b --device cuda --dtype bfloat16 --batch 64 --prompt 256 \
      --new-tokens 128 --repeats 3 --json "$results/generate_ours.json" || return 1
  else
    "$(bin benchmarks/generate_bench)" --shape demo --device cpu --batch 4 --prompt 16 --new-tokens 8 --repeats 1 \
      --json "$results/generate_ours.json" || return 1
  fi
  report  # ours first: transformers' import and its run take a while
  if have_transformers; then
    local args=(--shape qwen2.5-1.5b --dtype bfloat16 --batch 64 --prompt 256 --new-tokens 128 --repeats 3)
    have_cuda || args=(--shape qwen2.5-0.5b --dtype float32 --batch 2 --prompt 16 --new-tokens 4 --repeats 1)
    python3 "$root/benchmarks/transformers_generate.py" "${args[@]}" --json "$results/generate_transformers.json"
  fi
}

# The seed's step through the trainer's own loop: `qwen_gsm8k train` with random weights of the 1.5B shape (a model
# directory of config.json and the Qwen2.5 tokenizer, nothing else), GSM8K's train lines, the seed's settings (8
# prompts x 4 responses, 128 new tokens, 2 updates of 4 prompts, bfloat16 autocast over float32 weights and AdamW),
# dynamic sampling on: random weights never answer right, so --dummy-accuracy 0.7 scores each response correct with
# that probability, about Qwen2.5-1.5B-Instruct's GSM8K accuracy. Its memory plan first, then 3 steps, no checkpoint.
# The run writes into RESULTS: the report reads its metrics.jsonl as the steps land, even when the stage is stopped.
stage_train() {
  local model=$work/dummy-model run=$results/train-run shape=qwen2.5-1.5b
  local settings=(--train-batch-size 8 --rollout-n 4 --ppo-mini-batch-size 4 --max-new-tokens 128 --steps 3)
  local device=(--device cuda --autocast bfloat16)
  if ! have_cuda; then
    shape=small settings=(--train-batch-size 2 --rollout-n 4 --ppo-mini-batch-size 2 --max-new-tokens 8 --steps 2)
    device=(--device cpu)
  fi
  "$(bin benchmarks/dummy_model_dir)" --shape "$shape" --tokenizer "$shared/fixtures/tokenizer/qwen2.5" \
    --output "$model" || return 1
  local command=("$(bin examples/qwen_gsm8k/qwen_gsm8k)" train --model "$model" --load-format dummy
                 --dummy-accuracy 0.7 --train "$shared/data/gsm8k/train.jsonl" "${device[@]}" "${settings[@]}"
                 --save-every -1 --logger console,jsonl --output "$run" --overwrite)
  "${command[@]}" --memory-plan json >"$results/train_memory_plan.json" || return 1
  "${command[@]}"
}

# The profile of a decode step, an admission, an update micro-batch and an optimizer step (benchmarks/profile_bench).
stage_profile() {
  local args=(--shape qwen2.5-1.5b --device cuda --autocast bfloat16)
  have_cuda || args=(--shape demo --device cpu --batch 4 --prompt 16 --new-tokens 8 --groups 2 --response 16)
  "$(bin benchmarks/profile_bench)" "${args[@]}" --json "$results/profile.json" --markdown "$results/profile.md"
}

stage_step() {
  local tokenizer=$shared/fixtures/tokenizer/qwen2.5
  if have_cuda; then
    # verl's GSM8K example uses 1024 prompts x 5 responses of up to 1024 tokens; what fits in this check's minutes:
    # 64 prompts x 5 responses, 256 new tokens, mini-batches of 16 prompts in micro-batches of 4.
    "$(bin benchmarks/step_bench)" --shape qwen2.5-1.5b --device cuda --autocast bfloat16 --tokenizer "$tokenizer" \
      --prompts 64 --rollout-n 5 --new-tokens 256 --mini 16 --micro 4 --epochs 1 --steps 1 \
      --json "$results/step_verl.json" || return 1
    report
    # The shared-prompt update at the 1.5B itself: G = 4 (the seed's) and 8, the seed's GSM8K prompt length.
    "$(bin benchmarks/shared_prompt_bench)" --shape qwen2.5-1.5b --device cuda --autocast bfloat16 --rollout-n 4,8 \
      --pairs 2 --json "$results/shared_prompt.json"
  else
    "$(bin benchmarks/step_bench)" --shape demo --device cpu --prompts 4 --rollout-n 4 --new-tokens 16 --mini 4 \
      --epochs 1 --steps 1 --json "$results/step_verl.json" || return 1
    report
    "$(bin benchmarks/shared_prompt_bench)" --shape demo --device cpu --rollout-n 4 --prompt 16 --response 16 \
      --pairs 1 --json "$results/shared_prompt.json"
  fi
}

demo_device() { have_cuda && echo cuda || echo cpu; }
# A demo of a few minutes' fraction: enough for the trainer to save a checkpoint, not to learn. GRPO: its one step
# needs no informative group, which DAPO's dynamic sampling would wait for from a barely warmed-up model.
short_demo() {
  "$(bin examples/qwen_gsm8k/qwen_gsm8k)" demo --algo grpo --device "$(demo_device)" --overwrite --output "$1" \
    --sft-steps 20 --sft-min-steps 10 \
    --rl-steps 1 --rl-groups 4 --rl-mini-groups 4 --rollout-n 4 --eval-problems 10 "${@:2}"
}

stage_checkpoint() {
  local dir=$work/demo-short checkpoint
  rm -rf "$dir"
  short_demo "$dir" --quiet || return 1
  checkpoint=$dir/checkpoints/$(cat "$dir/checkpoints/latest")
  [[ -f $checkpoint/model.safetensors ]] || { echo "no checkpoint in $dir/checkpoints"; return 1; }
  echo "checkpoint: $checkpoint ($(ls "$checkpoint" | paste -sd' '))"
  have_transformers || { echo "skipped: transformers is not importable here"; return 3; }
  python3 "$root/tests/fixtures/transformers_golden.py" golden "$checkpoint" | tee "$results/checkpoint.json" || return 1
  DAPO_TRANSFORMERS_GOLDENS=$checkpoint DAPO_SHARED_DIR=$shared "$(bin tests/qwen_model_tests)" -tc='*transformers*' |
    tee "$results/checkpoint_test.txt"
}

stage_demo() {
  local dir=$work/demo
  rm -rf "$dir"
  if have_cuda; then
    "$(bin examples/qwen_gsm8k/qwen_gsm8k)" demo --device cuda --seed 1 --overwrite --output "$dir" || return 1
  else  # the full demo is the README's main job; here only the short one
    short_demo "$dir" || return 1
  fi
  cp "$dir/summary.json" "$results/demo_summary.json"
}
# The report of what has landed so far, written into OUT (device_report.py writes each file whole, then renames it).
report() { python3 "$root/benchmarks/device_report.py" "$results" "$out" --dry-run "$dry_run" --call "$call" >/dev/null; }
export -f unpack_deb stage_deps stage_build have_transformers have_cuda bin target_path stage_fixture stage_tests \
  stage_cuda_tests stage_generate stage_train stage_profile stage_step demo_device short_demo stage_checkpoint \
  stage_demo report

# --- the dry run's isolation: the system's copies of the carried packages hidden ----------------------------------
if ((dry_run)) && [[ -z $build_dir && -z ${DAPO_DEVICE_ISOLATED:-} ]]; then
  packages=$(for deb in "$carry"/debs/*.deb; do dpkg-deb -f "$deb" Package; done)
  DAPO_DEVICE_ISOLATED=1 DAPO_DEVICE_PACKAGES="$packages" exec unshare --mount --propagation private \
    bash "$0" "$call" --dry-run --stages "${stages#deps,}" --budget "$budget" ${kill_after:+--kill-after "$kill_after"} \
    "$out"
fi
if [[ -n ${DAPO_DEVICE_ISOLATED:-} ]]; then
  for package in $DAPO_DEVICE_PACKAGES; do
    dpkg -s "$package" >/dev/null 2>&1 || continue
    # Headers, CMake package files and .pc files (not libraries: programs of this namespace use them).
    while read -r path; do
      case $path in  # mask the package's top-level entry: /usr/include/nlohmann, /usr/share/cmake/CLI11, ...
        /usr/include/x86_64-linux-gnu/*) path=$(cut -d/ -f1-5 <<<"$path") ;;
        /usr/include/*) path=$(cut -d/ -f1-4 <<<"$path") ;;
        /usr/share/eigen3/*) path=/usr/share/eigen3 ;;
        /usr/share/cmake/*/* | /usr/lib/cmake/*/*) path=$(cut -d/ -f1-5 <<<"$path") ;;
        /usr/lib/x86_64-linux-gnu/cmake/*/*) path=$(cut -d/ -f1-6 <<<"$path") ;;
        *.pc) ;;
        *) continue ;;
      esac
      echo "$path"
    done < <(dpkg -L "$package")
  done | sort -u | while read -r path; do
    if [[ -d $path ]]; then mount -t tmpfs none "$path"; elif [[ -f $path ]]; then mount --bind /dev/null "$path"; fi
  done
  echo "dry run: the system's headers, CMake and pkg-config files of the carried packages are hidden"
fi

# --- running the stages -----------------------------------------------------------------------------------------
mkdir -p "$work" "$results" "$out"
if ((unpack_only)); then stage_deps; exit; fi
# This call's results start empty, and so does OUT: what comes back is this call's alone.
rm -rf "$results"/* && rm -f "$out"/report.md "$out"/results.json "$out"/profile.md "$out"/log.txt
exec > >(tee "$out/log.txt") 2>&1
start=$(date +%s)
echo "device-check: $(date -u '+%Y-%m-%d %H:%M UTC'), the $call call, stages $stages, budget ${budget}s, dry run $dry_run"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' 2>/dev/null ||
    echo "python3 has no torch"
  python3 -c 'import transformers; print("transformers", transformers.__version__)' 2>/dev/null ||
    echo "no transformers"
  nvcc --version 2>/dev/null | tail -1
  c++ --version | head -1
  cmake --version | head -1
  echo "$(nproc) cores"
} | tee "$results/machine.txt"

transformers_importable=0 cuda_available=0
python3 -c 'import transformers, torch' >/dev/null 2>&1 && transformers_importable=1
python3 -c 'import torch, sys; sys.exit(not torch.cuda.is_available())' >/dev/null 2>&1 && cuda_available=1
export transformers_importable cuda_available

# Caps in seconds: what each stage may take at most, within what is left of the budget.
# The headline's build compiles the driver and three benchmarks (about 150-200 s on 16 cores, estimated); the rest's
# adds the tests (another 150 s or so).
declare -A cap=([deps]=30 [build]=$([[ $call == headline ]] && echo 240 || echo 330) [generate]=100 [train]=110
                [profile]=70 [fixture]=60 [cuda_tests]=90 [step]=150 [checkpoint]=90 [demo]=120 [tests]=200)
((dry_run)) && cap[build]=$budget  # a cold build on 2 cores takes many minutes; on the GPU machine's 16, two or three
report
for stage in ${all_stages//,/ }; do
  [[ ,$stages, == *,$stage,* ]] || continue
  left=$((budget - ($(date +%s) - start)))
  limit=$((cap[$stage] < left - 5 ? cap[$stage] : left - 5))
  if ((limit < 15)); then
    status=skipped_time
    seconds=0
    echo "=== $stage: skipped, ${left}s left"
  else
    echo "=== $stage (at most ${limit}s)"
    begin=$(date +%s)
    timeout -k 10 "$limit" bash -o pipefail -c "stage_$stage"
    code=$?
    seconds=$(($(date +%s) - begin))
    case $code in
      0) status=ok ;;
      3) status=skipped ;;
      124 | 137) status=timeout ;;
      *) status=failed ;;
    esac
    echo "=== $stage: $status in ${seconds}s"
  fi
  echo "{\"stage\": \"$stage\", \"status\": \"$status\", \"seconds\": $seconds}" >>"$results/stages.jsonl"
  report  # OUT holds every stage so far: a command stopped at its limit brings them back
  if [[ $stage == "$kill_after" ]]; then
    echo "=== --kill-after $stage: killed as at the device tool's limit"
    kill -KILL $$
  fi
done
python3 "$root/benchmarks/device_report.py" "$results" "$out" --dry-run "$dry_run" --call "$call"
echo "device-check: done in $(($(date +%s) - start))s; $out: $(ls "$out" | paste -sd' ')"
