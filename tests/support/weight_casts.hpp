// Counts the casts that read a model's weights: aten::_to_copy calls, on any thread, whose input lies at the start of a
// parameter's memory (a weight itself, or a fused block of parameters, which begins at its first part's). Each is one
// cast kernel on a GPU, reading the whole weight. Only where available(): a build with asserts on (no NDEBUG: the
// sanitizer build) against a LibTorch built without them reads RecordFunction::inputs() through a debug-only member
// that LibTorch's RecordFunction does not have (LibTorch 1.13's header), so there the counter counts nothing.
#pragma once

#include <ATen/record_function.h>
#include <torch/torch.h>

#include <atomic>
#include <mutex>
#include <set>
#include <string_view>
#include <vector>

namespace dapo::test {

class WeightCastCounter {
 public:
  explicit WeightCastCounter(const std::vector<torch::Tensor>& parameters) {
    {
      const std::lock_guard<std::mutex> lock(mutex());
      weights().clear();
      for (const auto& parameter : parameters) {
        if (parameter.dim() == 2) weights().insert(parameter.data_ptr());
      }
    }
    count() = 0;
    if (!available()) return;
    at::enableRecordFunction(true);
    handle_ = at::addGlobalCallback(
        at::RecordFunctionCallback(&WeightCastCounter::start).scopes({at::RecordScope::FUNCTION}).needsInputs(true));
  }
  ~WeightCastCounter() {
    if (available()) at::removeCallback(handle_);
  }
  static constexpr bool available() {
#ifdef NDEBUG
    return true;
#else
    return false;
#endif
  }
  WeightCastCounter(const WeightCastCounter&) = delete;
  WeightCastCounter& operator=(const WeightCastCounter&) = delete;
  int64_t casts() const {
    return count();
  }

 private:
  static std::unique_ptr<at::ObserverContext> start(const at::RecordFunction& call) {
    if (std::string_view(call.name()) != "aten::_to_copy") return nullptr;
    const auto inputs = call.inputs();
    if (inputs.empty()) return nullptr;
    const c10::IValue& input = inputs[0];
    if (!input.isTensor() || !input.toTensor().defined()) return nullptr;
    const std::lock_guard<std::mutex> lock(mutex());
    if (weights().count(input.toTensor().data_ptr()) != 0) ++count();
    return nullptr;
  }
  static std::mutex& mutex() {
    static std::mutex value;
    return value;
  }
  static std::set<const void*>& weights() {
    static std::set<const void*> value;
    return value;
  }
  static std::atomic<int64_t>& count() {
    static std::atomic<int64_t> value{0};
    return value;
  }
  at::CallbackHandle handle_ = 0;
};

}  // namespace dapo::test
