// The compute copy: the model's structure again, each tensor cast from its source (see the header).
#include "qwen_gsm8k/model/compute_copy.hpp"

#include <stdexcept>
#include <string>

namespace qwen {

ComputeCopy::ComputeCopy(const Qwen2ForCausalLM& source, torch::ScalarType dtype) : copy_(source->config()) {
  const torch::NoGradGuard no_grad;
  const auto pair_up = [&](const auto& sources, const auto& targets, bool cast) {
    for (const auto& item : targets) {
      const torch::Tensor* from = sources.find(item.key());
      if (from == nullptr) throw std::logic_error("ComputeCopy: the source has no tensor " + item.key());
      const bool floating = from->is_floating_point();
      // Floating parameters in the compute dtype; the buffers (the rotary frequencies) as the source holds them.
      item.value().set_data(from->detach().to(from->device(), cast && floating ? dtype : from->scalar_type(),
                                              /*non_blocking=*/false, /*copy=*/true));
      item.value().requires_grad_(false);
      pairs_.emplace_back(*from, item.value());
    }
  };
  pair_up(source->named_parameters(), copy_->named_parameters(), true);
  pair_up(source->named_buffers(), copy_->named_buffers(), false);
  copy_->eval();
}

void ComputeCopy::refresh() {
  const torch::NoGradGuard no_grad;
  for (auto& [from, to] : pairs_) to.copy_(from);
}

int64_t ComputeCopy::bytes() const {
  int64_t total = 0;
  for (const auto& [from, to] : pairs_) total += static_cast<int64_t>(to.nbytes());
  return total;
}

}  // namespace qwen
