// Log-probabilities of chosen tokens straight from the last hidden states and the lm-head, without ever holding the
// full [N, V] logits: log p(target | logits / temperature) and optionally the entropy, as verl and TRL compute rollout
// and training log-probs. Chunks over N; the backward recomputes each chunk's logits, so at most one chunk of [chunk,
// V] values is alive at a time. Differentiable in hidden and weight.
//
// Each chunk's work over the vocabulary, beside its matrix products: on the CPU and, with the dapo::cuda target, on
// CUDA, one kernel each way (the statistics read the logits; the gradient rewrites them in place). Elsewhere ATen ops:
// one to three passes each way and [chunk, V] float32 buffers (see aten_chunk_forward and aten_chunk_backward).
//
// Shapes: N = tokens, H = hidden size, V = vocabulary, C = chunk_size.
//   hidden [N, H], weight [V, H] (the lm-head; the tied embedding matrix), targets [N] int64 -> logp [N], entropy [N].
#pragma once

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/types.h>

#include <cmath>

#include "dapo/core/logprob.hpp"
#include "dapo/detail/aten_kernels.hpp"
#include "dapo/detail/autograd_node.hpp"
#include "dapo/detail/tensor_checks.hpp"

namespace dapo {

struct LinearLogprobOptions {
  int64_t chunk_size = 1024;  // rows of logits computed at once: extra memory ~ chunk_size * V values on CPU
  double temperature = 1.0;   // the sampling temperature: log-probs of softmax(logits / temperature)
  bool with_entropy = false;  // also return the entropy of softmax(logits / temperature)
  // Check first that every target is a row of the weight, naming the first that is not. On a GPU the check waits for
  // the device (the host reads its result); false: the caller vouches for the targets (checked on the host before
  // they were copied) and nothing waits.
  bool check_targets = true;
};

struct LinearLogprobOutput {
  torch::Tensor logp;     // [N]
  torch::Tensor entropy;  // [N]; undefined unless with_entropy
};

namespace detail {

// The per-chunk work over the vocabulary as kernels: the CPU's from <dapo/core/logprob.hpp> below, and CUDA's from
// <dapo/cuda/logprob.cuh>, set by <dapo/cuda/register.cuh> (the dapo::cuda target; null without it). Both take
// contiguous logits [R, V] (already divided by the temperature) and [R] statistics in the compute dtype (float32 for
// 16-bit logits): statistics writes lse, chosen and, when defined, mean; logits_grad turns the logits into
// d objective / d logits in place (grad_logp, or grad_entropy with mean, may be undefined).
struct LogprobKernels {
  void (*statistics)(const torch::Tensor& logits, const torch::Tensor& targets, const torch::Tensor& lse,
                     const torch::Tensor& chosen, const torch::Tensor& mean) = nullptr;
  void (*logits_grad)(const torch::Tensor& logits, const torch::Tensor& targets, const torch::Tensor& lse,
                      const torch::Tensor& mean, const torch::Tensor& grad_logp,
                      const torch::Tensor& grad_entropy) = nullptr;
};

inline LogprobKernels& cuda_logprob_kernels() {
  static LogprobKernels kernels;
  return kernels;
}

inline namespace DAPO_KERNEL_ABI {  // the CPU kernel's callers: see <dapo/core/kernel_abi.hpp>

inline void cpu_softmax_statistics(const torch::Tensor& logits, const torch::Tensor& targets, const torch::Tensor& lse,
                                   const torch::Tensor& chosen, const torch::Tensor& mean) {
  visit_floating_dtype(logits.scalar_type(), "dapo::linear_logprobs", [&](auto compute_tag, auto storage_tag) {
    using C = decltype(compute_tag);
    using T = decltype(storage_tag);
    core::softmax_statistics<C>(logits.data_ptr<T>(), logits.size(0), logits.size(1), targets.data_ptr<int64_t>(),
                                lse.data_ptr<C>(), chosen.data_ptr<C>(), mean.defined() ? mean.data_ptr<C>() : nullptr,
                                AtenParallelFor{});
  });
}

inline void cpu_logprob_logits_grad(const torch::Tensor& logits, const torch::Tensor& targets, const torch::Tensor& lse,
                                    const torch::Tensor& mean, const torch::Tensor& grad_logp,
                                    const torch::Tensor& grad_entropy) {
  visit_floating_dtype(logits.scalar_type(), "dapo::linear_logprobs", [&](auto compute_tag, auto storage_tag) {
    using C = decltype(compute_tag);
    using T = decltype(storage_tag);
    core::logprob_logits_grad<C>(logits.data_ptr<T>(), logits.size(0), logits.size(1), targets.data_ptr<int64_t>(),
                                 lse.data_ptr<C>(), mean.defined() ? mean.data_ptr<C>() : nullptr,
                                 grad_logp.defined() ? grad_logp.data_ptr<C>() : nullptr,
                                 grad_entropy.defined() ? grad_entropy.data_ptr<C>() : nullptr, AtenParallelFor{});
  });
}

inline const LogprobKernels& cpu_logprob_kernels() {
  static const LogprobKernels kernels{&cpu_softmax_statistics, &cpu_logprob_logits_grad};
  return kernels;
}

// The kernels for hidden's device, or null: ATen ops (devices without kernels, or use_aten).
inline const LogprobKernels* logprob_kernels(const torch::Tensor& hidden, bool use_aten) {
  if (use_aten) return nullptr;
  if (hidden.device().is_cpu()) return &cpu_logprob_kernels();
  const LogprobKernels& cuda = cuda_logprob_kernels();
  return hidden.is_cuda() && cuda.statistics != nullptr && cuda.logits_grad != nullptr ? &cuda : nullptr;
}

// One chunk's forward with ATen ops: log p of the targets and, when entropy is defined, the entropy -sum p log p, in
// the statistics dtype. Passes over [C, V]: log_softmax (16-bit logits: ATen may convert them first) and, for the
// entropy, exp and a batched dot product.
inline void aten_chunk_forward(const torch::Tensor& logits, const torch::Tensor& targets, torch::ScalarType stats_type,
                               torch::Tensor logp, torch::Tensor entropy) {
  const torch::Tensor log_probs = at::log_softmax(logits, 1, stats_type);
  logp.copy_(log_probs.gather(1, targets.unsqueeze(1)).squeeze(1));
  if (!entropy.defined()) return;
  const torch::Tensor probs = log_probs.exp();
  entropy.copy_(at::bmm(probs.unsqueeze(1), log_probs.unsqueeze(2)).view({-1}).neg());
}

// One chunk's backward with ATen ops: logits <- d objective / d logits
//   = g_logp * (onehot(target) - p) - g_entropy * p * (log p + entropy),
// written in the logits' dtype, the targets' entries rounded once. Passes over [C, V]: softmax and one product without
// the entropy's gradient; log_softmax, exp, addcmul and the product with it.
inline void aten_chunk_backward(torch::Tensor logits, const torch::Tensor& targets, torch::ScalarType stats_type,
                                const torch::Tensor& entropy, const torch::Tensor& grad_logp,
                                const torch::Tensor& grad_entropy) {
  const torch::Tensor index = targets.unsqueeze(1);
  const torch::Tensor g_logp = grad_logp.defined() ? grad_logp.unsqueeze(1) : torch::Tensor();
  if (!grad_entropy.defined()) {
    const torch::Tensor probs = at::softmax(logits, 1, stats_type);
    const torch::Tensor target_grad = g_logp * (1.0 - probs.gather(1, index));
    at::mul_out(logits, probs, g_logp.neg());
    logits.scatter_(1, index, target_grad.to(logits.scalar_type()));
    return;
  }
  torch::Tensor scale = grad_entropy.unsqueeze(1);
  torch::Tensor shift = scale * entropy.unsqueeze(1);  // [C, 1]
  if (g_logp.defined()) shift = shift + g_logp;
  torch::Tensor log_probs = at::log_softmax(logits, 1, stats_type);
  const torch::Tensor probs = log_probs.exp();
  at::addcmul_out(log_probs, shift.neg(), log_probs, scale.neg());  // -(g_logp + g_entropy * (log p + entropy))
  torch::Tensor target_grad;
  if (g_logp.defined()) target_grad = g_logp + probs.gather(1, index) * log_probs.gather(1, index);
  at::mul_out(logits, probs, log_probs);
  if (target_grad.defined()) logits.scatter_(1, index, target_grad.to(logits.scalar_type()));
}

// The backward: recomputes each chunk's logits and turns them into d objective / d logits in place (the kernels, or
// ATen ops), then into the gradients of hidden and weight. An autograd Node of its own, not a
// torch::autograd::Function (see PolicyLossBackward in <dapo/loss.hpp>: g++ 14 warns inside LibTorch 2.x's
// Function<T>::apply). Saved like Function's save_for_backward: an in-place change of hidden or weight before the
// backward is an error, not a silent mistake.
struct LinearLogprobBackward : torch::autograd::Node {
  torch::autograd::SavedVariable hidden_, weight_;  // [N, H], [V, H]
  torch::Tensor targets;                            // [N]
  torch::Tensor lse, mean;                          // [N], with kernels; mean only with the entropy
  torch::Tensor entropy;                            // [N], with ATen ops and the entropy
  const LogprobKernels* kernels = nullptr;          // null: ATen ops
  torch::ScalarType stats_type = torch::kFloat32;
  int64_t chunk = 1;
  double inverse_temperature = 1.0;
  bool with_entropy = false;

  std::string name() const override { return "dapo::LinearLogprobBackward"; }
  void release_variables() override {
    hidden_.reset_data();
    weight_.reset_data();
    targets.reset();
    lse.reset();
    mean.reset();
    entropy.reset();
  }

  // grad_outputs: d objective / d logp and, with the entropy, d objective / d entropy (either may be undefined).
  torch::autograd::variable_list apply(torch::autograd::variable_list&& grad_outputs) override {
    torch::NoGradGuard no_grad;
    const torch::Tensor hidden = hidden_.unpack(), weight = weight_.unpack();
    const bool want_hidden = should_compute_output(0), want_weight = should_compute_output(1);
    const torch::Tensor grad_logp =
        grad_outputs[0].defined() ? grad_outputs[0].to(stats_type).contiguous() : torch::Tensor();
    const torch::Tensor grad_entropy = with_entropy && grad_outputs.size() > 1 && grad_outputs[1].defined()
                                           ? grad_outputs[1].to(stats_type).contiguous()
                                           : torch::Tensor();
    if (!grad_logp.defined() && !grad_entropy.defined()) return {torch::Tensor(), torch::Tensor()};
    const int64_t n = hidden.size(0), vocab = weight.size(0);

    torch::Tensor grad_hidden = want_hidden ? torch::empty_like(hidden) : torch::Tensor();
    torch::Tensor grad_weight = want_weight ? torch::zeros_like(weight) : torch::Tensor();
    torch::Tensor logits_buffer = torch::empty({chunk, vocab}, hidden.options());
    const auto part = [](const torch::Tensor& t, int64_t start, int64_t rows) {
      return t.defined() ? t.narrow(0, start, rows) : torch::Tensor();
    };
    for (int64_t start = 0; start < n; start += chunk) {
      const int64_t rows = std::min(chunk, n - start);
      const torch::Tensor scaled_hidden = hidden.narrow(0, start, rows) * inverse_temperature;  // [C, H]
      torch::Tensor logits = logits_buffer.narrow(0, 0, rows);
      at::mm_out(logits, scaled_hidden, weight.t());
      const torch::Tensor chunk_targets = targets.narrow(0, start, rows);
      if (kernels != nullptr) {
        RECORD_FUNCTION("dapo::logprob_logits_grad", std::vector<c10::IValue>({logits}));  // seen by profilers
        kernels->logits_grad(logits, chunk_targets, part(lse, start, rows), part(mean, start, rows),
                             part(grad_logp, start, rows), part(grad_entropy, start, rows));
      } else {
        aten_chunk_backward(logits, chunk_targets, stats_type, part(entropy, start, rows), part(grad_logp, start, rows),
                            part(grad_entropy, start, rows));
      }
      if (want_hidden) {
        torch::Tensor grad_rows = grad_hidden.narrow(0, start, rows);
        at::mm_out(grad_rows, logits, weight);
        grad_rows.mul_(inverse_temperature);
      }
      if (want_weight) grad_weight.addmm_(logits.t(), scaled_hidden);
    }
    return {grad_hidden, grad_weight};
  }
};

// The forward: each chunk's logits (one [C, V] buffer in the input dtype), then the kernels' statistics (lse, the
// target's logit and, for the entropy, the mean logit) or ATen ops (log p and the entropy); logp (and the entropy) get
// LinearLogprobBackward when hidden or weight requires grad.
inline LinearLogprobOutput linear_logprobs_forward(const torch::Tensor& hidden, const torch::Tensor& weight,
                                                   const torch::Tensor& targets, const LinearLogprobOptions& options,
                                                   bool use_aten) {
  const LogprobKernels* kernels = logprob_kernels(hidden, use_aten);
  const int64_t n = hidden.size(0), vocab = weight.size(0);
  const int64_t chunk = std::max<int64_t>(1, std::min<int64_t>(options.chunk_size, n));
  const double inverse_temperature = 1.0 / options.temperature;
  const torch::ScalarType stats_type = compute_dtype(hidden.scalar_type());
  const bool with_entropy = options.with_entropy;
  torch::Tensor logp, entropy, lse, mean;
  {
    torch::NoGradGuard no_grad;
    const auto stats_options = hidden.options().dtype(stats_type);
    torch::Tensor chosen;
    if (kernels != nullptr) {
      lse = torch::empty({n}, stats_options);
      chosen = torch::empty({n}, stats_options);
      if (with_entropy) mean = torch::empty({n}, stats_options);
    } else {
      logp = torch::empty({n}, stats_options);
      if (with_entropy) entropy = torch::empty({n}, stats_options);
    }
    torch::Tensor logits_buffer = torch::empty({chunk, vocab}, hidden.options());
    for (int64_t start = 0; start < n; start += chunk) {
      const int64_t rows = std::min(chunk, n - start);
      torch::Tensor logits = logits_buffer.narrow(0, 0, rows);
      at::mm_out(logits, hidden.narrow(0, start, rows) * inverse_temperature, weight.t());  // z / temperature
      const torch::Tensor chunk_targets = targets.narrow(0, start, rows);
      if (kernels != nullptr) {
        RECORD_FUNCTION("dapo::softmax_statistics", std::vector<c10::IValue>({logits}));  // seen by profilers
        kernels->statistics(logits, chunk_targets, lse.narrow(0, start, rows), chosen.narrow(0, start, rows),
                            with_entropy ? mean.narrow(0, start, rows) : torch::Tensor());
      } else {
        aten_chunk_forward(logits, chunk_targets, stats_type, logp.narrow(0, start, rows),
                           with_entropy ? entropy.narrow(0, start, rows) : torch::Tensor());
      }
    }
    if (kernels != nullptr) {
      logp = chosen - lse;
      if (with_entropy) entropy = lse - mean;
    }
  }
  if (torch::autograd::compute_requires_grad(hidden, weight)) {
    const auto node = detail::make_autograd_node<LinearLogprobBackward>();
    node->set_next_edges(torch::autograd::collect_next_edges(hidden, weight));
    node->hidden_ = torch::autograd::SavedVariable(hidden, /*is_output=*/false);
    node->weight_ = torch::autograd::SavedVariable(weight, /*is_output=*/false);
    node->targets = targets;
    node->kernels = kernels;
    node->lse = lse;
    node->mean = mean;
    if (kernels == nullptr) node->entropy = entropy.defined() ? entropy.clone() : torch::Tensor();
    node->stats_type = stats_type;
    node->chunk = chunk;
    node->inverse_temperature = inverse_temperature;
    node->with_entropy = with_entropy;
    torch::autograd::set_history(logp, node);
    if (entropy.defined()) torch::autograd::set_history(entropy, node);
  }
  return {logp, entropy};
}

// linear_logprobs after validation; use_aten forces the ATen-op path (what devices without kernels run) for tests on
// CPU.
inline LinearLogprobOutput linear_logprobs_unchecked(const torch::Tensor& hidden, const torch::Tensor& weight,
                                                     const torch::Tensor& targets, const LinearLogprobOptions& options,
                                                     bool use_aten) {
  return linear_logprobs_forward(hidden.contiguous(), weight.contiguous(), targets.contiguous(), options, use_aten);
}

}  // namespace DAPO_KERNEL_ABI
}  // namespace detail

inline namespace DAPO_KERNEL_ABI {

// log p(targets | hidden @ weight.T / temperature), chunked; see the file comment. bfloat16 / float16 inputs: the
// matrix products run in that dtype, the softmax statistics and the outputs in float32.
inline LinearLogprobOutput linear_logprobs(const torch::Tensor& hidden, const torch::Tensor& weight,
                                           const torch::Tensor& targets, const LinearLogprobOptions& options = {}) {
  constexpr const char* kWhere = "dapo::linear_logprobs";
  detail::check_floating(hidden, "hidden", kWhere);
  detail::check_dim(hidden, 2, "hidden", kWhere);
  detail::check_floating(weight, "weight", kWhere);
  detail::check_dim(weight, 2, "weight", kWhere);
  DAPO_REQUIRE(weight.size(1) == hidden.size(1), kWhere, "weight has shape ", detail::shape_of(weight),
               " but hidden has ", detail::shape_of(hidden), "; expected weight [V, ", hidden.size(1), "]");
  DAPO_REQUIRE(weight.scalar_type() == hidden.scalar_type(), kWhere, "weight has dtype ", weight.scalar_type(),
               " but hidden has ", hidden.scalar_type());
  detail::check_same_device(weight, hidden, "weight", "hidden", kWhere);
  detail::check_defined(targets, "targets", kWhere);
  DAPO_REQUIRE(targets.scalar_type() == torch::kLong, kWhere, "targets has dtype ", targets.scalar_type(),
               ", expected int64 token ids");
  DAPO_REQUIRE(targets.dim() == 1 && targets.size(0) == hidden.size(0), kWhere, "targets has shape ",
               detail::shape_of(targets), ", expected [", hidden.size(0), "] (one per row of hidden)");
  detail::check_same_device(targets, hidden, "targets", "hidden", kWhere);
  DAPO_REQUIRE(options.chunk_size >= 1, kWhere, "chunk_size is ", options.chunk_size, ", expected >= 1");
  DAPO_REQUIRE(std::isfinite(options.temperature) && options.temperature > 0.0, kWhere, "temperature is ",
               options.temperature, ", expected a finite value > 0");
  if (options.check_targets && targets.numel() > 0) {
    const std::string bad = detail::first_true_index((targets < 0) | (targets >= weight.size(0)));
    DAPO_REQUIRE(
        bad.empty(), kWhere, "targets", bad, " is ",
        bad.empty() ? 0 : targets.masked_select((targets < 0) | (targets >= weight.size(0)))[0].item<int64_t>(),
        ", expected a token id in [0, ", weight.size(0), ")");
  }
  return detail::linear_logprobs_unchecked(hidden, weight, targets, options, /*use_aten=*/false);
}

}  // namespace DAPO_KERNEL_ABI
}  // namespace dapo
