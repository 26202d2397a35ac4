// One product for linear layers sharing an input (see the header).
#include "qwen_gsm8k/model/fused_linear.hpp"

#include <stdexcept>

#include "qwen_gsm8k/model/autocast.hpp"
#include "qwen_gsm8k/model/block_cast.hpp"
#include "qwen_gsm8k/model/fused_training.hpp"

namespace qwen {
namespace {

// The parameters' tensors in layer order: the weights, or the biases.
std::vector<torch::Tensor> parts(const std::vector<torch::nn::Linear>& layers, bool biases) {
  std::vector<torch::Tensor> out;
  for (const auto& layer : layers) out.push_back(biases ? layer->bias : layer->weight);
  return out;
}

}  // namespace

FusedLinears::FusedLinears(std::vector<torch::nn::Linear> layers) : layers_(std::move(layers)) {
  if (layers_.empty()) throw std::invalid_argument("FusedLinears: no layers");
  const bool bias = static_cast<bool>(layers_.front()->bias.defined());
  for (const auto& layer : layers_) {
    if (layer->bias.defined() != bias) throw std::invalid_argument("FusedLinears: some layers have a bias, some not");
  }
}

bool FusedLinears::fused() const {
  const bool bias = layers_.front()->bias.defined();
  return weight_.defined() && lie_side_by_side(parts(layers_, false), weight_) &&
         (!bias || (bias_.defined() && lie_side_by_side(parts(layers_, true), bias_)));
}

void FusedLinears::fuse() {
  const torch::NoGradGuard no_grad;
  for (const bool biases : {false, true}) {
    if (biases && !layers_.front()->bias.defined()) break;
    const std::vector<torch::Tensor> tensors = parts(layers_, biases);
    const torch::Tensor block = torch::cat(tensors, 0);
    int64_t offset = 0;
    for (auto tensor : tensors) {  // each parameter becomes its slice of the block: same tensor, same values
      const int64_t rows = tensor.size(0);
      tensor.set_data(block.narrow(0, offset, rows));
      offset += rows;
    }
    // A leaf that asks for gradients (it never receives any: see the header), so that ATen's autocast caches its
    // cast where it caches and no AutocastGuard's autocast_weight cast is at hand.
    (biases ? bias_ : weight_) = alias_over(block, block.storage_offset(), block.sizes()).requires_grad_(true);
  }
}

torch::Tensor FusedLinears::forward(const torch::Tensor& x) {
  if (!fused()) fuse();
  const bool bias = layers_.front()->bias.defined();
  const auto& step = autocast_state::step_casts();
  if (const auto dtype = autocast_state::weight_cast_dtype(weight_); step && dtype) {
    // The optimizer step's cast of the block, differentiable with respect to the parts (WeightCastScope), and the
    // bias block once per step too (in its own dtype: no cast), which autocast's linear then casts.
    const torch::Tensor weight = step->get(
        weight_, *dtype, [&](torch::ScalarType to) { return block_cast(parts(layers_, false), weight_, to); });
    if (!bias) return fused::linear(x, weight, torch::Tensor());
    return fused::linear(x, weight, step->get(bias_, bias_.scalar_type(), [&](torch::ScalarType to) {
      return block_cast(parts(layers_, true), bias_, to);
    }));
  }
  if (!torch::GradMode::is_enabled()) {
    // The bias as it is: autocast casts it as it would an unfused layer's (a cast of the bias beforehand rounds
    // LibTorch 1.13's CPU bfloat16 products differently).
    return at::linear(x, autocast_weight(weight_), bias ? bias_ : torch::Tensor());
  }
  // The training forward's product with gradients has its backward as one node (fused::linear).
  return fused::linear(x, block_cast(parts(layers_, false), weight_, weight_.scalar_type()),
                       bias ? block_cast(parts(layers_, true), bias_, bias_.scalar_type()) : torch::Tensor());
}

}  // namespace qwen
