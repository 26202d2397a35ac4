#!/usr/bin/env bash
# The numeric CPU tests once more, under a second set of OpenBLAS float32 kernels, after scripts/test.sh has built and
# run everything under the machine's own: the LibTorch front ends (dapo_torch_tests) and the model's numerics
# (qwen_model_tests' model, generation, batched-product, config and safetensors cases: the goldens, last_logits against
# the full forward, batched against one-by-one generation, the direct attention products against torch::matmul).
# OpenBLAS picks its kernels by CPU unless OPENBLAS_CORETYPE names them, and kernels differ in how they sum a dot
# product; no test may depend on one kernel's rounding. The second set is Haswell's (AVX2 + FMA: what machines that
# set the variable use, safe on every AVX2 CPU), or, where the first run already had Haswell's, Sandybridge's (AVX
# without FMA, safe on every AVX CPU, rounded differently again). A value the machine sets is never unset: where a CPU
# needs it, its own kernels misbehave. No second build: the same binaries, in ${DAPO_BUILD_DIR:-build}.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# The kernel set OpenBLAS runs under the given environment, as it names it (python3 is one of the test packages).
kernel() {
  env "$@" python3 -c 'import ctypes
blas = ctypes.CDLL("libopenblas.so.0")
blas.openblas_get_corename.restype = ctypes.c_char_p
print(blas.openblas_get_corename().decode())'
}
first=$(kernel)
if [[ -n ${OPENBLAS_CORETYPE:-} ]]; then
  echo "blas-kernels: the suite ran with OpenBLAS's $first kernels (OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE, set by this machine)"
else
  echo "blas-kernels: the suite ran with OpenBLAS's $first kernels (chosen by CPU: OPENBLAS_CORETYPE is unset)"
fi
second=Haswell
[[ ${first,,} == haswell ]] && second=Sandybridge
[[ $(kernel OPENBLAS_CORETYPE=$second) == "$second" ]] || {
  echo "blas-kernels: OpenBLAS did not take OPENBLAS_CORETYPE=$second" >&2
  exit 1
}
echo "blas-kernels: the numeric CPU tests again with OpenBLAS's $second kernels (OPENBLAS_CORETYPE=$second)"
tests=${DAPO_BUILD_DIR:-build}/tests
export OPENBLAS_CORETYPE=$second
"$tests/dapo_torch_tests"
"$tests/qwen_model_tests"
