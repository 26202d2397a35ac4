// Mixed precision the way torch.autocast does it: float32 master weights and optimizer state, the forward's matrix
// products in bfloat16 (or float16), reductions and softmax in float32 (ATen's autocast lists). An RAII guard over
// ATen's thread-local autocast state for one device type, written against both LibTorch 1.13 and 2.x.
#pragma once

#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/types.h>
#include <torch/version.h>

#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <utility>

#include "qwen_gsm8k/model/block_cast.hpp"

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

namespace autocast_state {
struct WeightCast {
  torch::Tensor source, cast;  // source held so that no other tensor takes its key while cached
  const void* data = nullptr;
};
inline int& guards() {  // AutocastGuards alive on this thread
  thread_local int depth = 0;
  return depth;
}
}  // namespace autocast_state

// Casts of weights, kept while their holder lives. Two holders:
// - the outermost AutocastGuard's, without gradients (one cast per generation): ATen's autocast keeps its casts of
//   parameters the same way, but only where it caches (LibTorch 1.x's CPU autocast does not) and never for a weight
//   read through a view or a fused block;
// - a WeightCastScope's (an optimizer step's), with gradients: each cast is a node of the autograd graph, made once
//   and read by every micro-batch's forward, its checkpointed recomputes and the no-grad passes on the same weights;
//   each backward through it adds into the weight's float32 gradient (block_cast), as autocast's own cast and the
//   weight's AccumulateGrad do.
// Keyed by the tensor; the memory it read is checked too.
class WeightCasts {
 public:
  // The cast of `weight` in `dtype`, made the first time it is asked for (block_cast: its backward adds into the
  // weight's gradient).
  torch::Tensor get(const torch::Tensor& weight, torch::ScalarType dtype) {
    return get(weight, dtype, [&](torch::ScalarType to) { return block_cast({weight}, weight, to); });
  }
  // The same for `key`'s cast made by `cast(dtype)` (a fused block's block_cast over its parameters). Made with
  // gradients where the parameters ask for them, whatever the caller's grad mode, so that a no-grad pass and a
  // recompute with gradients share it.
  template <typename Cast>
  torch::Tensor get(const torch::Tensor& key, torch::ScalarType dtype, const Cast& cast_of) {
    const std::lock_guard<std::mutex> lock(mutex_);  // a CUDA backward recomputes on the autograd engine's thread
    const auto found = casts_.find(key.unsafeGetTensorImpl());
    if (found != casts_.end() && found->second.data == key.data_ptr() && found->second.cast.scalar_type() == dtype) {
      return found->second.cast;
    }
    const torch::AutoGradMode grad_mode(with_gradients_);
    torch::Tensor cast = cast_of(dtype);
    casts_[key.unsafeGetTensorImpl()] = {key, cast, key.data_ptr()};
    return cast;
  }
  void clear() {
    const std::lock_guard<std::mutex> lock(mutex_);
    casts_.clear();
  }
  explicit WeightCasts(bool with_gradients = false) : with_gradients_(with_gradients) {}

 private:
  bool with_gradients_;
  std::mutex mutex_;
  std::unordered_map<const c10::TensorImpl*, autocast_state::WeightCast> casts_;
};

namespace autocast_state {
inline WeightCasts& region_casts() {  // the outermost AutocastGuard's
  thread_local WeightCasts casts;
  return casts;
}
}  // namespace autocast_state

namespace autocast_state {
// The WeightCastScope's casts this thread reads (a checkpointed recompute installs its forward's: CheckpointBackward).
inline std::shared_ptr<WeightCasts>& step_casts() {
  thread_local std::shared_ptr<WeightCasts> casts;
  return casts;
}
// The dtype a matrix product reads a float32 `weight` in: inside an AutocastGuard that turned autocast on for its
// device, autocast's dtype where it is lower; empty otherwise.
inline std::optional<torch::ScalarType> weight_cast_dtype(const torch::Tensor& weight) {
  if (!weight.defined() || guards() == 0 || weight.scalar_type() != torch::kFloat32) return std::nullopt;
  const std::optional<torch::ScalarType> active = active_autocast_dtype(weight.device());
  if (!active || *active == torch::kFloat32) return std::nullopt;
  return active;
}
}  // namespace autocast_state

// `casts` installed as this thread's step casts while it lives, the previous ones put back after (a recompute on the
// autograd engine's thread installs its forward's: CheckpointBackward).
class StepCastsInstalled {
 public:
  explicit StepCastsInstalled(std::shared_ptr<WeightCasts> casts) : previous_(autocast_state::step_casts()) {
    autocast_state::step_casts() = std::move(casts);
  }
  ~StepCastsInstalled() { autocast_state::step_casts() = previous_; }
  StepCastsInstalled(const StepCastsInstalled&) = delete;
  StepCastsInstalled& operator=(const StepCastsInstalled&) = delete;

 private:
  std::shared_ptr<WeightCasts> previous_;
};

// One optimizer step's weight casts (the trainer's): while it lives, every autocast product on this thread reads its
// weight's cast from one WeightCasts with gradients, made once; clear() after the step's last backward (before the
// optimizer changes the weights in place). Scopes nest: the inner one's casts are read until it ends.
class WeightCastScope {
 public:
  WeightCastScope() : casts_(std::make_shared<WeightCasts>(/*with_gradients=*/true)), installed_(casts_) {}
  void clear() { casts_->clear(); }

 private:
  std::shared_ptr<WeightCasts> casts_;
  StepCastsInstalled installed_;
};

// A weight as a matrix product under autocast should read it, when autocast_state::weight_cast_dtype gives a dtype:
// - inside a WeightCastScope, its cast from the scope (one per optimizer step, with gradients);
// - without gradients, a float32 weight's copy in autocast's dtype, made once per outermost guard (one cast per
//   generation, not one per decode step);
// otherwise the weight itself, for autocast to cast as it does (with gradients the cast belongs in the graph).
inline torch::Tensor autocast_weight(const torch::Tensor& weight) {
  const std::optional<torch::ScalarType> dtype = autocast_state::weight_cast_dtype(weight);
  if (!dtype) return weight;
  if (const auto& step = autocast_state::step_casts()) return step->get(weight, *dtype);
  if (torch::GradMode::is_enabled()) return weight;
  return autocast_state::region_casts().get(weight, *dtype);
}

// `weight` in `dtype` for a product outside an AutocastGuard (the lm-head's log-probs): the WeightCastScope's cast
// where one is open, a cast of its own otherwise.
inline torch::Tensor cast_weight(const torch::Tensor& weight, torch::ScalarType dtype) {
  const auto& step = autocast_state::step_casts();
  if (!step || weight.scalar_type() != torch::kFloat32 || dtype == torch::kFloat32) return weight.to(dtype);
  return step->get(weight, dtype);
}

namespace autocast_state {
// This thread's autocast setting for one device type (CPU or CUDA), kept to be put back.
struct Saved {
  c10::DeviceType type = c10::DeviceType::CPU;
  bool enabled = false;
  torch::ScalarType dtype = torch::kFloat32;
  static Saved of(c10::DeviceType device_type) {
    return {device_type, autocast_state::enabled(device_type), autocast_state::get_dtype(device_type)};
  }
  void restore() const { autocast_state::set(type, enabled, dtype); }
};
}  // namespace autocast_state

class AutocastGuard {
 public:
  // dtype empty: no change (a no-op guard). Devices other than CPU and CUDA: no change.
  AutocastGuard(torch::Device device, std::optional<torch::ScalarType> dtype) {
    if (!dtype || !(device.is_cpu() || device.is_cuda())) return;
    active_ = true;
    saved_ = autocast_state::Saved::of(device.type());
    autocast_state::set(device.type(), true, *dtype);
    at::autocast::increment_nesting();
    ++autocast_state::guards();
  }
  ~AutocastGuard() {
    if (!active_) return;
    if (--autocast_state::guards() == 0) autocast_state::region_casts().clear();
    if (at::autocast::decrement_nesting() == 0) {  // casts of weights cached in the region
      at::autocast::clear_cache();
    }
    saved_.restore();
  }
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  bool active_ = false;  // false: a no-op guard
  autocast_state::Saved saved_;
};

// Autocast off on `device` while it lives, when `off` (a model that already computes in the low precision: its ops'
// float32 policies would cast its activations up), restored after.
class AutocastOff {
 public:
  explicit AutocastOff(torch::Device device, bool off = true) {
    if (!off || !(device.is_cpu() || device.is_cuda())) return;
    active_ = true;
    saved_ = autocast_state::Saved::of(device.type());
    autocast_state::set(device.type(), false, saved_.dtype);
  }
  ~AutocastOff() {
    if (active_) saved_.restore();
  }
  AutocastOff(const AutocastOff&) = delete;
  AutocastOff& operator=(const AutocastOff&) = delete;

 private:
  bool active_ = false;
  autocast_state::Saved saved_;
};

}  // namespace qwen
