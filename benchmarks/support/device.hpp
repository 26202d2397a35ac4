// The device a benchmark runs on (--device cpu, cuda or cuda:N): parsing that fails before any work when CUDA is
// absent, synchronisation before a clock stops, the device's name, and the peak memory of LibTorch's CUDA caching
// allocator. The allocator's statistics need LibTorch's CUDA headers, so they are compiled only where
// benchmarks/CMakeLists.txt defines DAPO_BENCH_CUDA (a LibTorch with CUDA); elsewhere they are reported as null.
#pragma once

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/cuda.h>
#include <torch/types.h>
#include <torch/version.h>

#if defined(DAPO_BENCH_CUDA)
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "support/harness.hpp"

namespace dapo::bench {

// cpu, cuda (= cuda:0) or cuda:N. Throws std::invalid_argument naming --device when the text is none of these, when
// this LibTorch has no CUDA or sees no GPU, or when there is no GPU N. A CUDA device becomes the current one, so that
// streams and allocations without an explicit device stay on it.
inline torch::Device parse_device(const std::string& text) {
  std::optional<torch::Device> device;
  try {
    device.emplace(text);
  } catch (const std::exception&) {
  }
  if (!device || !(device->is_cpu() || device->is_cuda())) {
    throw std::invalid_argument("--device is '" + text + "', expected cpu, cuda or cuda:N");
  }
  if (device->is_cpu()) return torch::kCPU;
  if (!torch::cuda::is_available()) {
    throw std::invalid_argument("--device is " + text + ", but CUDA is not available here (this LibTorch " +
                                std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) +
                                " was built without CUDA, or no GPU is visible); use --device cpu");
  }
  const auto count = static_cast<int64_t>(torch::cuda::device_count());
  const int64_t index = device->has_index() ? device->index() : 0;
  if (index >= count) {
    throw std::invalid_argument("--device is " + text + ", but only " + std::to_string(count) +
                                " GPU(s) are visible (cuda:0 to cuda:" + std::to_string(count - 1) + ")");
  }
  const torch::Device cuda(torch::kCUDA, static_cast<c10::DeviceIndex>(index));
  c10::impl::getDeviceGuardImpl(cuda.type())->setDevice(cuda);
  return cuda;
}

// Waits for the device's queued work (kernels run asynchronously on CUDA); nothing to do on the CPU.
inline void synchronize(torch::Device device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

// "cpu (<CPU model>)", or "cuda:N (<GPU name>, <memory> GiB)" where LibTorch has CUDA.
inline std::string device_name(torch::Device device) {
  if (device.is_cpu()) return "cpu (" + cpu_model() + ")";
#if defined(DAPO_BENCH_CUDA)
  const cudaDeviceProp* properties = at::cuda::getDeviceProperties(device.index());
  char memory[32];
  std::snprintf(memory, sizeof memory, "%.0f GiB", static_cast<double>(properties->totalGlobalMem) / (1 << 30));
  return device.str() + " (" + properties->name + ", " + memory + ")";
#else
  return device.str();
#endif
}

// The memory bandwidth a streaming copy reaches on `device`, in GB/s (10^9 bytes), bytes read plus bytes written: what
// a decode step's bound is measured against on this card (an H100 SXM reaches about 3,000 of its data sheet's 3,350;
// an H200 about 4,300 of 4,800). A 1 GiB float32 copy on a GPU (256 MiB on the CPU), one warm-up, the median of 5.
inline double copy_bandwidth_gbs(torch::Device device) {
  const int64_t bytes = device.is_cuda() ? (int64_t{1} << 30) : (int64_t{256} << 20);
  const auto options = torch::TensorOptions().device(device).dtype(torch::kFloat32);
  const at::Tensor source = at::ones({bytes / 4}, options);
  at::Tensor target = at::empty_like(source);
  std::vector<double> seconds;
  for (int repeat = 0; repeat < 6; ++repeat) {
    synchronize(device);
    const auto start = std::chrono::steady_clock::now();
    target.copy_(source);
    synchronize(device);
    if (repeat > 0) seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return 2.0 * static_cast<double>(bytes) / median(seconds) / 1e9;
}

// The data sheet's memory bandwidth of the GPUs this project is measured on, by the name the driver reports, in GB/s;
// nullopt for any other device.
inline std::optional<double> datasheet_bandwidth_gbs([[maybe_unused]] torch::Device device) {
#if defined(DAPO_BENCH_CUDA)
  if (device.is_cuda()) {
    const std::string name = at::cuda::getDeviceProperties(device.index())->name;
    if (name.find("H200") != std::string::npos) return 4800.0;
    if (name.find("H100") != std::string::npos) return name.find("PCIe") != std::string::npos ? 2000.0 : 3350.0;
  }
#endif
  return std::nullopt;
}

// --autocast's value: bfloat16, float16 or off; an empty `name` becomes bfloat16 on CUDA, off elsewhere. Throws
// std::invalid_argument naming --autocast for any other text.
inline std::optional<torch::ScalarType> parse_autocast(std::string& name, torch::Device device) {
  if (name.empty()) name = device.is_cuda() ? "bfloat16" : "off";
  if (name == "bfloat16") return torch::kBFloat16;
  if (name == "float16") return torch::kHalf;
  if (name != "off") throw std::invalid_argument("--autocast is '" + name + "', expected bfloat16, float16 or off");
  return std::nullopt;
}

// Peak bytes of LibTorch's CUDA caching allocator since the last reset_peak_memory: allocated (held by tensors) and
// reserved (taken from the driver, cached blocks included). Empty off CUDA and in builds without CUDA.
struct PeakMemory {
  int64_t allocated_bytes = 0, reserved_bytes = 0;
};

// The allocator's API is the same in LibTorch 1.13 (c10::cuda::CUDACachingAllocator::DeviceStats, int device) and 2.x
// (c10::CachingDeviceAllocator::DeviceStats, c10::DeviceIndex; emptyCache gains a defaulted memory-pool argument),
// up to the types that `auto` and the implicit index conversion absorb; index 0 of each StatArray is
// StatType::AGGREGATE (both pools). So no TORCH_VERSION guard is needed.

// Starts a measurement: hands the allocator's cached free blocks back to the driver (those of earlier work, such as
// the float32 weights a model was cast from), so that the reserved peak counts what the measured work holds.
inline void reset_peak_memory([[maybe_unused]] torch::Device device) {
#if defined(DAPO_BENCH_CUDA)
  if (device.is_cuda()) {
    c10::cuda::CUDACachingAllocator::emptyCache();
    c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
  }
#endif
}

inline std::optional<PeakMemory> peak_memory([[maybe_unused]] torch::Device device) {
#if defined(DAPO_BENCH_CUDA)
  if (device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    return PeakMemory{stats.allocated_bytes[0].peak, stats.reserved_bytes[0].peak};
  }
#endif
  return std::nullopt;
}

// The JSON fields of a peak: peak_device_memory_bytes (allocated by tensors: what PyTorch's
// torch.cuda.max_memory_allocated() reports) and peak_device_reserved_bytes; null where there is none to report (CPU,
// or a LibTorch without CUDA).
inline nlohmann::json peak_memory_json(const std::optional<PeakMemory>& peak) {
  if (!peak) return {{"peak_device_memory_bytes", nullptr}, {"peak_device_reserved_bytes", nullptr}};
  return {{"peak_device_memory_bytes", peak->allocated_bytes}, {"peak_device_reserved_bytes", peak->reserved_bytes}};
}

// For tables: "12.34 GiB allocated, 13.00 GiB reserved", or "n/a (<why>)".
inline std::string peak_memory_text(const std::optional<PeakMemory>& peak, torch::Device device) {
  if (!peak) return device.is_cuda() ? "n/a (built without LibTorch CUDA)" : "n/a (CPU)";
  char text[96];
  std::snprintf(text, sizeof text, "%.2f GiB allocated, %.2f GiB reserved",
                static_cast<double>(peak->allocated_bytes) / (1 << 30),
                static_cast<double>(peak->reserved_bytes) / (1 << 30));
  return text;
}

}  // namespace dapo::bench
