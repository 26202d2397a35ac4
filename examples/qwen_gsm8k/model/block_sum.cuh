// A block-wide sum for the fused operators' CUDA kernels (model/fused_ops_cuda.cu, model/fused_training_cuda.cu): each
// thread's value summed over a block of kThreads threads (a multiple of the warp's 32), by warp shuffles and one
// shared slot per warp, the total returned to every thread. Every thread of the block must call it.
#pragma once

namespace qwen::fused::cuda {

template <int kThreads, typename Acc>
__device__ Acc block_sum(Acc value) {
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "block_sum: whole warps, at most 1024 threads");
  __shared__ Acc partial[kThreads / 32];
  __shared__ Acc total;
  for (int offset = 16; offset > 0; offset /= 2) value += __shfl_xor_sync(0xffffffffu, value, offset);
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  if (lane == 0) partial[warp] = value;
  __syncthreads();
  if (warp == 0) {
    value = lane < kThreads / 32 ? partial[lane] : Acc(0);
    for (int offset = 16; offset > 0; offset /= 2) value += __shfl_xor_sync(0xffffffffu, value, offset);
    if (lane == 0) total = value;
  }
  __syncthreads();
  return total;
}

}  // namespace qwen::fused::cuda
