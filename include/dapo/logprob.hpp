// Log-probabilities of chosen tokens straight from the last hidden states and the lm-head, without ever holding the
// full [N, V] logits: log p(target | logits / temperature) and optionally the entropy, as verl and TRL compute rollout
// and training log-probs. Chunks over N; the backward recomputes each chunk's logits, so at most one chunk of [chunk,
// V] values is alive at a time (on CPU; other devices add a work buffer). Differentiable in hidden and weight.
//
// Shapes: N = tokens, H = hidden size, V = vocabulary, C = chunk_size.
//   hidden [N, H], weight [V, H] (the lm-head; the tied embedding matrix), targets [N] int64 -> logp [N], entropy [N].
#pragma once

#include <ATen/ATen.h>
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
inline namespace DAPO_KERNEL_ABI {  // the CPU kernel's callers: see <dapo/core/kernel_abi.hpp>

// Softmax statistics of one chunk of logits z [C, V] (already divided by the temperature) with ATen ops, for devices
// without the CPU kernel: lse = logsumexp(z) and, for the entropy, mean = E_p[z]. work: a [C, V] buffer.
struct ChunkSoftmax {
  torch::Tensor lse, mean;
};

inline ChunkSoftmax aten_chunk_softmax(const torch::Tensor& logits, bool with_mean, torch::Tensor& work) {
  ChunkSoftmax out;
  const torch::Tensor max = logits.amax(1, /*keepdim=*/true);  // [C, 1]
  at::sub_out(work, logits, max).exp_();                       // work = exp(z - max)
  const torch::Tensor sum = work.sum(1);                       // [C]
  out.lse = sum.log() + max.squeeze(1);
  if (with_mean) out.mean = work.mul_(logits).sum(1) / sum;
  return out;
}

// The backward: recomputes each chunk's logits and turns them into d objective / d logits in place, then into the
// gradients of hidden and weight. An autograd Node of its own, not a torch::autograd::Function (see PolicyLossBackward
// in <dapo/loss.hpp>: g++ 14 warns inside LibTorch 2.x's Function<T>::apply). Saved like Function's
// save_for_backward: an in-place change of hidden or weight before the backward is an error, not a silent mistake.
struct LinearLogprobBackward : torch::autograd::Node {
  torch::autograd::SavedVariable hidden_, weight_;  // [N, H], [V, H]
  torch::Tensor targets, lse, mean;                 // [N]; mean undefined without the entropy
  int64_t chunk = 1;
  double inverse_temperature = 1.0;
  bool use_aten = false;

  std::string name() const override { return "dapo::LinearLogprobBackward"; }
  void release_variables() override {
    hidden_.reset_data();
    weight_.reset_data();
    targets.reset();
    lse.reset();
    mean.reset();
  }

  // grad_outputs: d objective / d logp and, with the entropy, d objective / d entropy (either may be undefined).
  torch::autograd::variable_list apply(torch::autograd::variable_list&& grad_outputs) override {
    torch::NoGradGuard no_grad;
    const torch::Tensor hidden = hidden_.unpack(), weight = weight_.unpack();
    const bool want_hidden = should_compute_output(0), want_weight = should_compute_output(1);
    const auto stats_type = lse.scalar_type();
    const torch::Tensor grad_logp =
        grad_outputs[0].defined() ? grad_outputs[0].to(stats_type).contiguous() : torch::Tensor();
    const torch::Tensor grad_entropy = mean.defined() && grad_outputs.size() > 1 && grad_outputs[1].defined()
                                           ? grad_outputs[1].to(stats_type).contiguous()
                                           : torch::Tensor();
    if (!grad_logp.defined() && !grad_entropy.defined()) return {torch::Tensor(), torch::Tensor()};
    const int64_t n = hidden.size(0), vocab = weight.size(0);

    torch::Tensor grad_hidden = want_hidden ? torch::empty_like(hidden) : torch::Tensor();
    torch::Tensor grad_weight = want_weight ? torch::zeros_like(weight) : torch::Tensor();
    torch::Tensor logits_buffer = torch::empty({chunk, vocab}, hidden.options());
    torch::Tensor stats_buffer, work_buffer;
    if (use_aten) {
      if (stats_type != hidden.scalar_type())
        stats_buffer = torch::empty({chunk, vocab}, hidden.options().dtype(stats_type));
      work_buffer = torch::empty({chunk, vocab}, hidden.options().dtype(stats_type));
    }
    for (int64_t start = 0; start < n; start += chunk) {
      const int64_t rows = std::min(chunk, n - start);
      const torch::Tensor scaled_hidden = hidden.narrow(0, start, rows) * inverse_temperature;  // [C, H]
      torch::Tensor logits = logits_buffer.narrow(0, 0, rows);
      at::mm_out(logits, scaled_hidden, weight.t());
      const torch::Tensor chunk_targets = targets.narrow(0, start, rows);
      const torch::Tensor chunk_grad_logp = grad_logp.defined() ? grad_logp.narrow(0, start, rows) : torch::Tensor();
      const torch::Tensor chunk_grad_entropy =
          grad_entropy.defined() ? grad_entropy.narrow(0, start, rows) : torch::Tensor();
      // logits <- d objective / d z = g_logp * (onehot(target) - p) - g_entropy * p * (z - E_p[z]).
      if (use_aten) {
        torch::Tensor z = stats_buffer.defined() ? stats_buffer.narrow(0, 0, rows).copy_(logits) : logits;
        torch::Tensor p = work_buffer.narrow(0, 0, rows);
        at::sub_out(p, z, lse.narrow(0, start, rows).unsqueeze(1)).exp_();
        if (chunk_grad_entropy.defined()) {
          z.sub_(mean.narrow(0, start, rows).unsqueeze(1)).mul_(chunk_grad_entropy.unsqueeze(1));
        } else {
          z.zero_();
        }
        if (chunk_grad_logp.defined()) z.add_(chunk_grad_logp.unsqueeze(1));
        z.mul_(p).neg_();
        if (chunk_grad_logp.defined()) z.scatter_add_(1, chunk_targets.unsqueeze(1), chunk_grad_logp.unsqueeze(1));
        if (stats_buffer.defined()) logits.copy_(z);
      } else {
        visit_floating_dtype(hidden.scalar_type(), "dapo::linear_logprobs", [&](auto compute_tag, auto storage_tag) {
          using C = decltype(compute_tag);
          using T = decltype(storage_tag);
          core::logprob_logits_grad<C>(logits.data_ptr<T>(), rows, vocab, chunk_targets.data_ptr<int64_t>(),
                                       lse.data_ptr<C>() + start, mean.defined() ? mean.data_ptr<C>() + start : nullptr,
                                       chunk_grad_logp.defined() ? chunk_grad_logp.data_ptr<C>() : nullptr,
                                       chunk_grad_entropy.defined() ? chunk_grad_entropy.data_ptr<C>() : nullptr,
                                       AtenParallelFor{});
        });
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

// The forward: the softmax statistics chunk by chunk (the core kernels on CPU, one [C, V] buffer in the input dtype;
// ATen ops elsewhere, plus float32 copies for 16-bit inputs and a work buffer); logp (and the entropy) get
// LinearLogprobBackward when hidden or weight requires grad.
inline LinearLogprobOutput linear_logprobs_forward(const torch::Tensor& hidden, const torch::Tensor& weight,
                                                   const torch::Tensor& targets, const LinearLogprobOptions& options,
                                                   bool use_aten) {
  torch::Tensor lse, chosen, mean;
  int64_t chunk = 1;
  double inverse_temperature = 1.0;
  {
    torch::NoGradGuard no_grad;
    const int64_t n = hidden.size(0), vocab = weight.size(0);
    chunk = std::max<int64_t>(1, std::min<int64_t>(options.chunk_size, n));
    inverse_temperature = 1.0 / options.temperature;
    const auto stats_options = hidden.options().dtype(compute_dtype(hidden.scalar_type()));
    const bool with_mean = options.with_entropy;
    lse = torch::empty({n}, stats_options);
    chosen = torch::empty({n}, stats_options);
    if (with_mean) mean = torch::empty({n}, stats_options);

    torch::Tensor logits_buffer = torch::empty({chunk, vocab}, hidden.options());
    torch::Tensor stats_buffer, work_buffer;
    if (use_aten) {
      if (stats_options.dtype() != hidden.dtype()) stats_buffer = torch::empty({chunk, vocab}, stats_options);
      work_buffer = torch::empty({chunk, vocab}, stats_options);
    }
    for (int64_t start = 0; start < n; start += chunk) {
      const int64_t rows = std::min(chunk, n - start);
      torch::Tensor logits = logits_buffer.narrow(0, 0, rows);
      at::mm_out(logits, hidden.narrow(0, start, rows) * inverse_temperature, weight.t());  // z / temperature
      const torch::Tensor chunk_targets = targets.narrow(0, start, rows);
      if (use_aten) {
        if (stats_buffer.defined()) logits = stats_buffer.narrow(0, 0, rows).copy_(logits);
        torch::Tensor work = work_buffer.narrow(0, 0, rows);
        const ChunkSoftmax stats = aten_chunk_softmax(logits, with_mean, work);
        chosen.narrow(0, start, rows).copy_(logits.gather(1, chunk_targets.unsqueeze(1)).squeeze(1));
        lse.narrow(0, start, rows).copy_(stats.lse);
        if (with_mean) mean.narrow(0, start, rows).copy_(stats.mean);
        continue;
      }
      visit_floating_dtype(hidden.scalar_type(), "dapo::linear_logprobs", [&](auto compute_tag, auto storage_tag) {
        using C = decltype(compute_tag);
        using T = decltype(storage_tag);
        core::softmax_statistics<C>(logits.data_ptr<T>(), rows, vocab, chunk_targets.data_ptr<int64_t>(),
                                    lse.data_ptr<C>() + start, chosen.data_ptr<C>() + start,
                                    with_mean ? mean.data_ptr<C>() + start : nullptr, AtenParallelFor{});
      });
    }
  }
  torch::Tensor logp, entropy;
  {
    torch::NoGradGuard no_grad;
    logp = chosen - lse;
    if (options.with_entropy) entropy = lse - mean;
  }
  if (torch::autograd::compute_requires_grad(hidden, weight)) {
    const auto node = detail::make_autograd_node<LinearLogprobBackward>();
    node->set_next_edges(torch::autograd::collect_next_edges(hidden, weight));
    node->hidden_ = torch::autograd::SavedVariable(hidden, /*is_output=*/false);
    node->weight_ = torch::autograd::SavedVariable(weight, /*is_output=*/false);
    node->targets = targets;
    node->lse = lse;
    node->mean = mean;
    node->chunk = chunk;
    node->inverse_temperature = inverse_temperature;
    node->use_aten = use_aten;
    torch::autograd::set_history(logp, node);
    if (entropy.defined()) torch::autograd::set_history(entropy, node);
  }
  return {logp, entropy};
}

// linear_logprobs after validation; use_aten forces the ATen-op path (what non-CPU devices run) for tests on CPU.
inline LinearLogprobOutput linear_logprobs_unchecked(const torch::Tensor& hidden, const torch::Tensor& weight,
                                                     const torch::Tensor& targets, const LinearLogprobOptions& options,
                                                     bool use_aten) {
  return linear_logprobs_forward(hidden.contiguous(), weight.contiguous(), targets.contiguous(), options,
                                 use_aten || !hidden.device().is_cpu());
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
