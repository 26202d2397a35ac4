// Gradient checkpointing as one autograd node (see the header).
#include "qwen_gsm8k/model/gradient_checkpointing.hpp"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "dapo/detail/autograd_node.hpp"
#include "qwen_gsm8k/model/autocast.hpp"
#include "qwen_gsm8k/model/block_cast.hpp"

namespace qwen {
namespace {

struct CheckpointBackward : torch::autograd::Node {
  std::function<torch::Tensor(const torch::Tensor&)> run;
  torch::autograd::SavedVariable input;
  std::vector<torch::Tensor> parameters;  // the leaves themselves: their values at the backward are the forward's
  torch::Device device = torch::kCPU;
  std::optional<torch::ScalarType> autocast;  // the forward's autocast dtype on `device`, none when it was off
  std::shared_ptr<WeightCasts> casts;         // the forward's WeightCastScope casts, read again by the recompute

  std::string name() const override { return "qwen::CheckpointBackward"; }
  void release_variables() override {
    input.reset_data();
    parameters.clear();
    casts.reset();
    run = nullptr;
  }
  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    TORCH_CHECK(run, "qwen::checkpointed: the backward ran twice (its saved input is released after the first)");
    torch::autograd::variable_list result(1 + parameters.size());
    if (!grads[0].defined()) return result;
    // The function again, with gradients, on a detached copy of the saved input (a leaf of this inner graph).
    const torch::Tensor x = input.unpack().detach().requires_grad_(should_compute_output(0));
    torch::Tensor out;
    {
      const torch::AutoGradMode grad_mode(true);
      const AutocastGuard autocast_guard(device, autocast);
      const StepCastsInstalled step_casts(casts);  // on this thread, which is not the forward's on CUDA
      out = run(x);
    }
    if (accumulating_backward()) {
      // A backward into .grad (the trainer's): the recompute's too, so that its parameters take their gradients as
      // without checkpointing (a block_cast's one add per weight block) and this node hands on only the input's.
      if (out.requires_grad()) {
        torch::autograd::backward({out}, {grads[0]}, /*retain_graph=*/false, /*create_graph=*/false);
      }
      if (should_compute_output(0)) result[0] = x.grad();
      return result;
    }
    std::vector<torch::Tensor> wrt;
    std::vector<std::size_t> slot;
    if (should_compute_output(0)) wrt.push_back(x), slot.push_back(0);
    for (std::size_t i = 0; i < parameters.size(); ++i) {
      if (should_compute_output(1 + i)) wrt.push_back(parameters[i]), slot.push_back(1 + i);
    }
    if (wrt.empty()) return result;
    const auto computed = torch::autograd::grad({out}, wrt, {grads[0]}, /*retain_graph=*/false,
                                                /*create_graph=*/false, /*allow_unused=*/true);
    for (std::size_t i = 0; i < computed.size(); ++i) result[slot[i]] = computed[i];
    return result;
  }
};

}  // namespace

torch::Tensor checkpointed(const std::function<torch::Tensor(const torch::Tensor&)>& run, const torch::Tensor& input,
                           const std::vector<torch::Tensor>& parameters) {
  bool needs_grad = input.requires_grad();
  for (const torch::Tensor& parameter : parameters) needs_grad = needs_grad || parameter.requires_grad();
  if (!torch::GradMode::is_enabled() || !needs_grad) return run(input);
  torch::Tensor out;
  {
    const torch::NoGradGuard no_grad;  // the forward keeps nothing for a backward
    out = run(input);
  }
  const auto node = dapo::detail::make_autograd_node<CheckpointBackward>();
  torch::autograd::edge_list edges;
  edges.reserve(1 + parameters.size());
  edges.push_back(input.requires_grad() ? torch::autograd::impl::gradient_edge(input) : torch::autograd::Edge());
  for (const torch::Tensor& parameter : parameters) {
    edges.push_back(parameter.requires_grad() ? torch::autograd::impl::gradient_edge(parameter)
                                              : torch::autograd::Edge());
  }
  node->set_next_edges(std::move(edges));
  node->run = run;
  node->input = torch::autograd::SavedVariable(input, /*is_output=*/false);
  node->parameters = parameters;
  node->device = input.device();
  node->autocast = active_autocast_dtype(input.device());
  node->casts = autocast_state::step_casts();
  torch::autograd::set_history(out, node);
  return out;
}

}  // namespace qwen
