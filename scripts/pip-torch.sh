#!/usr/bin/env bash
# The pip-torch leg: dapo built against the LibTorch inside pip's torch wheel (2.15, with CUDA), the one verl and TRL
# users already have, from the anchors' virtual environment (scripts/anchors.sh). One build in build-pip-torch/ with
# the host's nvcc: every program, the CUDA kernels, the CUDA extension of torch.ops.dapo and the driver's CUDA paths
# compiled and linked against pip's CUDA LibTorch (sm_90), then the CPU tests run against it: the library's (core,
# torch), the model's, and the Python ones with the anchors' python3, which holds TRL: tests/python/test_trl_anchor.py
# runs TRL's own GRPOTrainer loss beside dapo's there (required in this leg). Extra arguments go to ctest.
#   -DCMAKE_PREFIX_PATH=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)') is the whole CMake line.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
venv=$(bash scripts/anchors.sh env)
python=$venv/bin/python
prefix=$("$python" -c 'import torch; print(torch.utils.cmake_prefix_path)')
build=${DAPO_BUILD_DIR:-build-pip-torch}
cuda_args=()
if command -v nvcc > /dev/null; then
  # libtorch_cuda.so needs the wheel's own CUDA libraries (nvidia/*/lib beside torch, found at run time through its
  # RUNPATH); at link time the linker must be told where they are, or it takes older ones from the system (an older
  # libnccl.so.2 from the CUDA toolkit here: "undefined reference to ncclCommGrow").
  site=$("$python" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
  wheel_libs=$(find "$site/nvidia" -mindepth 2 -maxdepth 2 -name lib -type d 2> /dev/null | sort | paste -sd:)
  cuda_args=(-DCMAKE_CUDA_COMPILER="$(command -v nvcc)" -DDAPO_CUDA_ARCHITECTURES=90)
  [[ -z $wheel_libs ]] || cuda_args+=("-DCMAKE_EXE_LINKER_FLAGS=-Wl,-rpath-link,$wheel_libs")
else
  echo "pip-torch: no nvcc on the PATH: the CUDA kernels are not compiled (the CPU tests still run)" >&2
fi
echo "pip-torch: torch $("$python" -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda)')," \
     "transformers $("$python" -c 'import transformers; print(transformers.__version__)')," \
     "trl $("$python" -c 'import trl; print(trl.__version__)'), $(nvcc --version 2> /dev/null | tail -1 || true)"
# The tests' programs, the driver, the Python ops, the GPU benchmarks and, with nvcc, the kernel's compile and ABI
# tests; the text, trainer and consumer tests run in the other legs.
targets=(dapo_core_tests dapo_torch_tests qwen_model_tests dapo_torch_ops qwen_gsm8k generate_bench step_bench profile_bench)
tests='core|torch|qwen_model|python'
if ((${#cuda_args[@]})); then
  targets+=(dapo_cuda_kernels_compile_test dapo_kernel_abi_test)
  tests+='|kernel_abi'
fi
mkdir -p "$build"
DAPO_BUILD_DIR=$build DAPO_EXTRA_CMAKE_ARGS="-DCMAKE_PREFIX_PATH=$prefix -DDAPO_PYTHON=$python ${cuda_args[*]}" \
  scripts/setup.sh "${targets[@]}" | tee "$build/setup.log"
if ((${#cuda_args[@]})); then
  grep -q "dapo: LibTorch .* with CUDA" "$build/setup.log" || {
    echo "pip-torch: pip's LibTorch was not configured with CUDA (see $build/setup.log)" >&2
    exit 1
  }
  # The fused CUDA loss reached the driver: its registration's kernels are linked into qwen_gsm8k.
  kernels=$(nm -C "$build/examples/qwen_gsm8k/qwen_gsm8k" | grep -c ' [TtWw] void dapo::cuda::detail::policy_loss_units_kernel<' || true)
  ((kernels > 0)) || { echo "pip-torch: qwen_gsm8k holds no policy-loss CUDA kernel" >&2; exit 1; }
  echo "pip-torch: CUDA compiled and linked against pip's LibTorch: qwen_gsm8k holds $kernels policy-loss kernel stubs"
fi
DAPO_REQUIRE_TRL=1 ctest --test-dir "$build" --output-on-failure --parallel "$(nproc)" -R "^($tests)\$" "$@"
# TRL's anchor counts each loss_type and option it found equal (tests/python/test_trl_anchor.py): shown here, and
# required, since ctest prints a passing test's output only into its log.
if (($# == 0)); then
  log=$build/Testing/Temporary/LastTest.log
  grep -ao "trl anchor: .*" "$log" || true
  for loss_type in dapo grpo bnpo dr_grpo; do
    grep -aq "trl anchor: loss_type $loss_type: [1-9][0-9]* cases equal" "$log" || {
      echo "pip-torch: TRL's anchor reported no equal case for loss_type $loss_type ($log)" >&2
      exit 1
    }
  done
fi
