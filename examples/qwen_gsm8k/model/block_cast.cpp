// A block of parameters read in a product's dtype, whose backward adds into the parameters' gradients (see the header).
#include "qwen_gsm8k/model/block_cast.hpp"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/torch.h>

#include <string>

#include "dapo/detail/autograd_node.hpp"

namespace qwen {
namespace {

using torch::Tensor;
using torch::autograd::variable_list;

// Edges: the parts, in order.
struct BlockCastBackward : torch::autograd::Node {
  std::vector<Tensor> parts;  // the parameters (held: the node lives one optimizer step, or one forward's graph)
  std::vector<int64_t> block_sizes;
  at::ScalarType dtype = at::kFloat;  // the parts'
  Tensor gradient;                    // the parts' gradients as one block, once they are its slices

  std::string name() const override { return "qwen::BlockCastBackward"; }

  variable_list apply(variable_list&& grads) override {
    variable_list out(parts.size());
    const Tensor& grad = grads[0];
    if (!grad.defined()) return out;
    if (accumulating_backward() && accumulate(grad)) return out;  // the parts' AccumulateGrad nodes receive nothing
    const Tensor whole = grad.scalar_type() == dtype ? grad : grad.to(dtype);
    int64_t offset = 0;
    for (std::size_t i = 0; i < parts.size(); ++i) {
      const int64_t rows = parts[i].size(0);
      if (should_compute_output(i)) out[i] = parts.size() == 1 ? whole : whole.narrow(0, offset, rows);
      offset += rows;
    }
    return out;
  }

 private:
  // Adds `grad` to the parts' gradients in one pass; false where they are not one block (the caller hands out rows).
  bool accumulate(const Tensor& grad) {
    const torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < parts.size(); ++i) {
      if (!next_edge(i).is_valid()) return false;  // a frozen part
    }
    if (find_gradient_block()) {
      gradient.add_(grad);
      return true;
    }
    for (const Tensor& part : parts) {
      if (part.grad().defined()) return false;  // some set by another path: theirs to add to
    }
    gradient = grad.scalar_type() == dtype
                   ? grad.clone(at::MemoryFormat::Contiguous)
                   : grad.to(dtype, /*non_blocking=*/false, /*copy=*/true, at::MemoryFormat::Contiguous);
    publish();
    return true;
  }

  // Whether the parts' gradients lie side by side, contiguous, in their dtype and shapes: `gradient` then covers them.
  bool find_gradient_block() {
    std::vector<Tensor> grads;
    for (const Tensor& part : parts) {
      const Tensor& grad = part.grad();
      if (!grad.defined() || grad.scalar_type() != dtype || grad.sizes() != part.sizes()) return false;
      grads.push_back(grad);
    }
    if (!lie_side_by_side(grads)) return false;
    const Tensor& first = grads.front();
    if (parts.size() == 1) {
      gradient = first;
    } else if (!gradient.defined() || gradient.data_ptr() != first.data_ptr()) {
      gradient = alias_over(first, first.storage_offset(), block_sizes);
    }
    return true;
  }

  // Each part's gradient: its rows of `gradient`.
  void publish() {
    if (parts.size() == 1) {
      parts.front().mutable_grad() = gradient;
      return;
    }
    int64_t offset = gradient.storage_offset();
    for (Tensor& part : parts) {
      part.mutable_grad() = alias_over(gradient, offset, part.sizes());
      offset += part.numel();
    }
  }
};

// `block` in `dtype` as a new tensor, read without gradients.
Tensor plain_cast(const Tensor& block, torch::ScalarType dtype) {
  const torch::NoGradGuard no_grad;
  if (block.scalar_type() != dtype) return block.to(dtype);
  return block.is_contiguous() ? alias_over(block, block.storage_offset(), block.sizes()) : block.detach();
}

}  // namespace

bool accumulating_backward() {
  const auto* info = torch::autograd::get_current_graph_task_exec_info();
  return info != nullptr && info->empty();
}

bool lie_side_by_side(const std::vector<torch::Tensor>& tensors, const torch::Tensor& block) {
  if (tensors.empty() || !tensors.front().defined()) return false;
  const Tensor& first = tensors.front();
  const auto* base = static_cast<const char*>(first.data_ptr());
  int64_t bytes = 0;
  for (const Tensor& tensor : tensors) {
    if (!tensor.defined() || tensor.scalar_type() != first.scalar_type() || tensor.device() != first.device() ||
        !tensor.is_contiguous() || !tensor.storage().is_alias_of(first.storage()) ||
        static_cast<const char*>(tensor.data_ptr()) != base + bytes) {
      return false;
    }
    bytes += static_cast<int64_t>(tensor.nbytes());
  }
  if (!block.defined()) return true;
  return block.data_ptr() == first.data_ptr() && block.scalar_type() == first.scalar_type() &&
         block.device() == first.device() && bytes == static_cast<int64_t>(block.nbytes());
}

torch::Tensor alias_over(const torch::Tensor& like, int64_t offset, at::IntArrayRef sizes) {
  const torch::NoGradGuard no_grad;
  return torch::empty({0}, like.options()).set_(like.storage(), offset, sizes, c10::contiguous_strides(sizes));
}

torch::Tensor block_cast(const std::vector<torch::Tensor>& parts, const torch::Tensor& block, torch::ScalarType dtype) {
  TORCH_CHECK(!parts.empty(), "block_cast: no parts");
  TORCH_CHECK(parts.size() == 1 || block.is_contiguous(), "block_cast: a block of ", parts.size(),
              " parts is not contiguous");
  Tensor out = plain_cast(block, dtype);
  bool any = false;
  for (const Tensor& part : parts) any = any || part.requires_grad();
  if (!torch::GradMode::is_enabled() || !any) return out;
  const auto node = dapo::detail::make_autograd_node<BlockCastBackward>();
  node->parts = parts;
  node->block_sizes = block.sizes().vec();
  node->dtype = parts.front().scalar_type();
  node->set_next_edges(torch::autograd::collect_next_edges(parts));
  torch::autograd::set_history(out, node);
  return out;
}

}  // namespace qwen
