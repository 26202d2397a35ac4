// The peak memory of each training step, as verl logs it (perf/max_memory_allocated_gb, perf/max_memory_reserved_gb,
// in GiB = 2^30 bytes): on CUDA the caching allocator's peaks since the step began (allocated: held by tensors, what
// torch.cuda.max_memory_allocated() reports; reserved: taken from the driver, cached blocks included); on the CPU the
// tracking allocator's peak of tensor bytes (CpuMemoryTracker, installed for the monitor's life), plus the bytes the
// caller says were held before it was installed (the weights). The CPU has no reserved figure. Not a profiler: one
// number per phase of interest, cheap enough for every step.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace qwen {

class CpuMemoryTracker;

class MemoryMonitor {
 public:
  // held_before_bytes: tensor bytes alive before the monitor (on the CPU, where the tracker counts only what is
  // allocated under it). On the CPU, when another CpuMemoryTracker is already installed (a test or a benchmark that
  // measures for itself), the monitor measures nothing and reports nothing.
  MemoryMonitor(torch::Device device, int64_t held_before_bytes);
  ~MemoryMonitor();
  MemoryMonitor(const MemoryMonitor&) = delete;
  MemoryMonitor& operator=(const MemoryMonitor&) = delete;

  // A step begins: the peak starts again from what is held now.
  void start();
  // perf/max_memory_allocated_gb (and perf/max_memory_reserved_gb on CUDA) since start(); empty when not measured.
  std::map<std::string, double> peak_metrics() const;

 private:
  torch::Device device_;
  int64_t held_before_bytes_ = 0;
  std::unique_ptr<CpuMemoryTracker> tracker_;
};

// The free and total memory of a CUDA device as its driver reports them (cudaMemGetInfo), before anything is loaded;
// nullopt on the CPU and in builds without CUDA.
struct DeviceMemoryInfo {
  int64_t free_bytes = 0, total_bytes = 0;
};
std::optional<DeviceMemoryInfo> device_memory_info(torch::Device device);

// Bytes of the tensors' storage (numel x element size).
int64_t tensor_bytes(const std::vector<torch::Tensor>& tensors);

}  // namespace qwen
