// Each step's peak memory: CUDA's caching allocator, or the tracking CPU allocator (device_memory.hpp).
#include "qwen_gsm8k/model/device_memory.hpp"

#if defined(DAPO_DRIVER_CUDA)
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#endif

#include <vector>

#include "qwen_gsm8k/model/memory_tracker.hpp"

namespace qwen {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

}  // namespace

MemoryMonitor::MemoryMonitor(torch::Device device, int64_t held_before_bytes)
    : device_(device), held_before_bytes_(held_before_bytes) {
  if (device_.is_cpu() && !CpuMemoryTracker::installed()) tracker_ = std::make_unique<CpuMemoryTracker>();
}

MemoryMonitor::~MemoryMonitor() = default;

void MemoryMonitor::start() {
  if (tracker_) tracker_->reset_peak();
#if defined(DAPO_DRIVER_CUDA)
  // The allocator's API is the same in LibTorch 1.13 and 2.x up to types that the index conversion absorbs.
  if (device_.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(device_.index());
#endif
}

std::map<std::string, double> MemoryMonitor::peak_metrics() const {
  std::map<std::string, double> metrics;
  if (tracker_) {
    metrics["perf/max_memory_allocated_gb"] = static_cast<double>(held_before_bytes_ + tracker_->peak_bytes()) / kGiB;
  }
#if defined(DAPO_DRIVER_CUDA)
  if (device_.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device_.index());
    // Index 0 of each StatArray is StatType::AGGREGATE (both pools).
    metrics["perf/max_memory_allocated_gb"] = static_cast<double>(stats.allocated_bytes[0].peak) / kGiB;
    metrics["perf/max_memory_reserved_gb"] = static_cast<double>(stats.reserved_bytes[0].peak) / kGiB;
  }
#endif
  return metrics;
}

std::optional<DeviceMemoryInfo> device_memory_info([[maybe_unused]] torch::Device device) {
#if defined(DAPO_DRIVER_CUDA)
  if (device.is_cuda()) {
    const c10::cuda::CUDAGuard guard(device.has_index() ? device.index() : c10::DeviceIndex{0});
    std::size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) return std::nullopt;
    return DeviceMemoryInfo{static_cast<int64_t>(free), static_cast<int64_t>(total)};
  }
#endif
  return std::nullopt;
}

int64_t tensor_bytes(const std::vector<torch::Tensor>& tensors) {
  int64_t bytes = 0;
  for (const auto& tensor : tensors) {
    if (tensor.defined()) bytes += tensor.numel() * static_cast<int64_t>(tensor.element_size());
  }
  return bytes;
}

}  // namespace qwen
