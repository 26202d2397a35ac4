// Mixed precision the way torch.autocast does it: float32 master weights and optimizer state, the forward's matrix
// products in bfloat16 (or float16), reductions and softmax in float32 (ATen's autocast lists). An RAII guard over
// ATen's thread-local autocast state for one device type, written against both LibTorch 1.13 and 2.x.
#pragma once

#include <ATen/autocast_mode.h>
#include <torch/types.h>
#include <torch/version.h>

#include <optional>

namespace qwen {

namespace autocast_state {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
inline bool enabled(c10::DeviceType type) {
  return at::autocast::is_autocast_enabled(type);
}
inline torch::ScalarType get_dtype(c10::DeviceType type) {
  return at::autocast::get_autocast_dtype(type);
}
inline void set(c10::DeviceType type, bool on, torch::ScalarType dtype) {
  at::autocast::set_autocast_enabled(type, on);
  at::autocast::set_autocast_dtype(type, dtype);
}
#else
inline bool enabled(c10::DeviceType type) {
  return type == c10::DeviceType::CUDA ? at::autocast::is_enabled() : at::autocast::is_cpu_enabled();
}
inline torch::ScalarType get_dtype(c10::DeviceType type) {
  return type == c10::DeviceType::CUDA ? at::autocast::get_autocast_gpu_dtype()
                                       : at::autocast::get_autocast_cpu_dtype();
}
inline void set(c10::DeviceType type, bool on, torch::ScalarType dtype) {
  if (type == c10::DeviceType::CUDA) {
    at::autocast::set_enabled(on);
    at::autocast::set_autocast_gpu_dtype(dtype);
  } else {
    at::autocast::set_cpu_enabled(on);
    at::autocast::set_autocast_cpu_dtype(dtype);
  }
}
#endif
}  // namespace autocast_state

// The dtype autocast computes matrix products in on `device` (its keys and values too), or empty when autocast is off
// there. Generation sizes its KV cache with it: float32 master weights under bfloat16 autocast get a bfloat16 cache.
inline std::optional<torch::ScalarType> active_autocast_dtype(torch::Device device) {
  if (!(device.is_cpu() || device.is_cuda()) || !autocast_state::enabled(device.type())) return std::nullopt;
  return autocast_state::get_dtype(device.type());
}

class AutocastGuard {
 public:
  // dtype empty: no change (a no-op guard). Devices other than CPU and CUDA: no change.
  AutocastGuard(torch::Device device, std::optional<torch::ScalarType> dtype) {
    if (!dtype || !(device.is_cpu() || device.is_cuda())) return;
    type_ = device.type();
    active_ = true;
    previous_enabled_ = autocast_state::enabled(type_);
    previous_dtype_ = autocast_state::get_dtype(type_);
    autocast_state::set(type_, true, *dtype);
    at::autocast::increment_nesting();
  }
  ~AutocastGuard() {
    if (!active_) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();  // casts of weights cached in the region
    autocast_state::set(type_, previous_enabled_, previous_dtype_);
  }
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  bool active_ = false, previous_enabled_ = false;
  c10::DeviceType type_ = c10::DeviceType::CPU;
  torch::ScalarType previous_dtype_ = torch::kFloat32;
};

}  // namespace qwen
