#!/usr/bin/env bash
# The CUDA compile check, run only inside the Debian 13 root, by `scripts/libtorch2.sh cuda` (the root has Debian 13's
# libtorch-cuda-dev unpacked in /opt/libtorch-cuda-dev; /usr/local/cuda is the host's nvcc, bound in). It configures
# dapo against that LibTorch 2.6 with CUDA, for sm_90, and compiles every object of the driver with -Werror: the
# fused CUDA loss (src/dapo_cuda.cu with include/dapo/cuda/register.cuh), the CUDA compile test, every driver source
# with its CUDA branches (USE_C10D_NCCL, the CUDA device guard, SDPA with grouped heads), and the GPU benchmarks
# generate_bench and step_bench with theirs (DAPO_BENCH_CUDA: the caching allocator's peak memory, the GPU's name).
# Nothing is linked: LibTorch's CUDA libraries (libtorch_cuda, libc10_cuda) cannot be installed without a GPU, so the
# link steps are replaced by a stamp (CMAKE_*_LINK_EXECUTABLE) and targets do not wait for the absent shared libraries
# (CMAKE_LINK_DEPENDS_NO_SHARED). docs/platforms.md lists what this covers and what only a GPU machine can check.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

prefix=/opt/libtorch-cuda-dev/usr
nvcc=/usr/local/cuda/bin/nvcc
[[ -d $prefix/include/ATen/cuda ]] || {
  echo "cuda-compile-in-root: $prefix holds no LibTorch CUDA headers (run it as scripts/libtorch2.sh cuda)" >&2
  exit 1
}
[[ -x $nvcc ]] || {
  echo "cuda-compile-in-root: no nvcc at $nvcc (the host's /usr/local/cuda must be bound in)" >&2
  exit 1
}
build=${DAPO_CUDA_BUILD_DIR:-build-cuda}

# LibTorch's CMake config insists that the libraries of its imported targets exist. They are never read here (no link
# step runs), so each missing one gets a placeholder file that says so.
libdir=$prefix/lib/x86_64-linux-gnu
for library in $(sed -n 's|.*IMPORTED_LOCATION[A-Z_]* "${_IMPORT_PREFIX}/x86_64-linux-gnu/\([^"]*\)".*|\1|p' \
                   "$libdir"/cmake/Caffe2/Caffe2Targets-*.cmake); do
  [[ -e $libdir/$library ]] || echo "placeholder for the CUDA compile check: never linked" > "$libdir/$library"
done
stamp='<CMAKE_COMMAND> -E touch <TARGET>'
# CUDA 13 dropped the nvToolsExt library (NVTX 3 is header-only); LibTorch 2.6's config still links CUDA::nvToolsExt,
# built for CUDA 12. An empty stand-in, included right after project(), lets it configure.
mkdir -p "$build"
shim=$build/nvtoolsext-shim.cmake
echo 'if(NOT TARGET CUDA::nvToolsExt)
  add_library(CUDA::nvToolsExt INTERFACE IMPORTED)
endif()' > "$shim"

echo "cuda-compile-in-root: $($nvcc --version | tail -1), host compiler g++ $(g++ -dumpversion), LibTorch $(
  sed -n 's/.*PACKAGE_VERSION "\(.*\)".*/\1/p' "$prefix/lib/x86_64-linux-gnu/cmake/Torch/TorchConfigVersion.cmake")"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER_LAUNCHER=ccache \
      -DCMAKE_PREFIX_PATH="$prefix/lib/x86_64-linux-gnu/cmake" -DCUDAToolkit_ROOT=/usr/local/cuda \
      -DCMAKE_CUDA_COMPILER="$nvcc" -DDAPO_CUDA_ARCHITECTURES=90 -DDAPO_WERROR=ON -DDAPO_UNITY_BUILD=OFF \
      -DCMAKE_PROJECT_INCLUDE="$(pwd)/$shim" -DC10_CUDA_LIBRARY="$libdir/libc10_cuda.so.2.6.0" \
      -DCMAKE_LINK_DEPENDS_NO_SHARED=ON -DCMAKE_CXX_LINK_EXECUTABLE="$stamp" -DCMAKE_CUDA_LINK_EXECUTABLE="$stamp" \
      -DCMAKE_CXX_CREATE_SHARED_LIBRARY="$stamp" -DCMAKE_CXX_CREATE_SHARED_MODULE="$stamp" 2>&1 |
  tee "$build/configure.log"
grep -q "dapo: LibTorch .* with CUDA" "$build/configure.log" || {
  echo "cuda-compile-in-root: LibTorch was not configured with CUDA (see $build/configure.log)" >&2
  exit 1
}
# The driver (with everything it links: the fused CUDA loss registration, NCCL and device-guard branches), the
# kernel's compile test, and the three benchmarks that run on a GPU (support/device.hpp under DAPO_BENCH_CUDA). The
# tests and the other benchmarks have no CUDA-only code; the LibTorch 2.x leg compiles them. And torch.ops.dapo
# (python/), the Python extension, against LibTorch 2.6's CUDA headers.
cmake --build "$build" -j"$(nproc)" --target qwen_gsm8k dapo_cuda_kernels_compile_test generate_bench step_bench \
  profile_bench dapo_torch_ops

# What was compiled (the build is up to date: every object is current): objects by kind; the registration object must
# hold the kernel's launch stubs.
objects=$(find "$build" -name '*.o' | sort)
cu_objects=$(grep -c '\.cu\.o$' <<< "$objects" || true)
cpp_objects=$(grep -c '\.cpp\.o$' <<< "$objects" || true)
echo "cuda-compile-in-root: $cu_objects CUDA and $cpp_objects C++ objects compiled against LibTorch's CUDA headers;" \
     "nothing linked"
registration=$(grep 'dapo_cuda.cu.o$' <<< "$objects") || {
  echo "cuda-compile-in-root: src/dapo_cuda.cu was not compiled" >&2
  exit 1
}
kernels=$(nm -C "$registration" | grep ' [TtWw] void dapo::cuda::detail::policy_loss_units_kernel<' | sed 's/(.*//' |
            sort -u | wc -l || true)
if ((kernels == 0)); then
  echo "cuda-compile-in-root: $registration holds no policy-loss kernel" >&2
  exit 1
fi
echo "cuda-compile-in-root: ok ($registration holds the host side of $kernels policy-loss kernel instantiations, sm_90)"
