// Padded training batches and the log-probs a policy gives them. The trainer and the demo's warm start build their
// batches here, so both see the same rows, masks and log-probs.
//
// Shapes: B = rows (sequences), L = the longest prompt + response, N = target tokens in the loss mask.
//   input_ids, attention_mask [B, L] int64, right-padded; loss_mask, old_logp [B, L - 1] (position t predicts t + 1).
#pragma once

#include <dapo/advantage.hpp>

#include <torch/torch.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "qwen_gsm8k/model/model.hpp"
#include "qwen_gsm8k/train/rollout.hpp"

namespace qwen {

// One row: prompt + response tokens; the response's tokens are targets in the loss unless in_loss is false.
struct BatchRow {
  std::vector<int64_t> tokens;  // prompt then response
  int64_t prompt_length = 0;
  bool in_loss = true;
};

struct PaddedBatch {
  torch::Tensor input_ids;              // [B, L] int64, pad_id after each row's end
  torch::Tensor attention_mask;         // [B, L] int64
  torch::Tensor loss_mask;              // [B, L - 1] bool: the target is a response token that counts in the loss
  std::vector<int64_t> prompt_lengths;  // [B]: each row's prompt tokens (its response starts there)
};

PaddedBatch pad_rows(const std::vector<BatchRow>& rows, int64_t pad_id);

// The tensors of a DAPO step: every response as one row of prompt + response, groups consecutive.
struct TrainBatch {
  PaddedBatch padded;
  torch::Tensor advantages;  // [B] float32
  // [B, L - 1] float32 (float64 for a float64 model), 0 outside loss_mask; set by the update, on the model's device.
  torch::Tensor old_logp;
  int64_t groups = 0, group_size = 0;
  // [B, L - 1] float32: the sampler's log-probs of the response tokens (Response::logprobs), 0 elsewhere; undefined
  // when a response has none (rollouts given by a test).
  torch::Tensor rollout_logp = {};
  // Set by the update when asked for, on the model's device: the reference policy's log-probs (a KL loss) [B, L - 1],
  // as old_logp; rollout correction's IS weights [B, L - 1] float32 (undefined: none). The rest lives on the host.
  torch::Tensor ref_logp = {}, is_weights = {};
};

// mask_truncated: truncated responses stay in the batch (they count in their group's advantages) but out of the loss.
// estimator: grpo runs dapo::group_advantages with `advantage`; the others dapo::core::estimate_advantages with each
// group as one prompt and each response's score on its last token.
TrainBatch build_train_batch(const std::vector<Group>& groups, int64_t group_size, int64_t pad_id, bool mask_truncated,
                             const dapo::AdvantageOptions& advantage,
                             dapo::AdvantageEstimator estimator = dapo::AdvantageEstimator::kGrpo);

struct LogprobOptions {
  double temperature = 1.0;   // log-probs of softmax(logits / temperature)
  int64_t chunk_size = 1024;  // rows of lm-head logits alive at once (dapo::linear_logprobs)
  std::optional<torch::ScalarType> autocast = std::nullopt;  // forward (and the lm-head product) in this dtype
  bool with_entropy = false;  // also the entropy of softmax(logits / temperature) at each target
};

// The log-probs of a batch's loss_mask targets, on the model's device, with grad when grad mode is on.
struct TargetLogprobs {
  torch::Tensor logp;         // [N] in loss_mask's row-major order, or [B, L - 1] with 0 outside loss_mask
  torch::Tensor entropy;      // the same shape (with grad: an entropy term of the loss); undefined without with_entropy
  torch::Tensor entropy_sum;  // 0-d, detached: the entropy added up over the targets; undefined without with_entropy
};

// Log-probs of the loss_mask targets under the model, [N]. The rows go to the model's device through host_door (input
// ids, attention mask and the targets' positions: copies, no wait); the host decides from its own values whether the
// rows are right-padded, where the targets are and that their ids are in the vocabulary. Tensors on a device are read
// back first (one counted read each): pass the host's.
TargetLogprobs target_logprobs(Qwen2ForCausalLM& model, const torch::Tensor& input_ids,  // [B, L]
                               const torch::Tensor& attention_mask,                      // [B, L]
                               const torch::Tensor& loss_mask,                           // [B, L - 1]
                               const LogprobOptions& options);

// The rows (right-padded, on the host) as the shared-prompt forward takes them: one prompt per distinct prompt
// (its first prompt_lengths[b] tokens), in order of first appearance, and every row's response.
SharedPromptBatch shared_prompt_batch(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                                      const std::vector<int64_t>& prompt_lengths);

// target_logprobs with each distinct prompt among the rows computed once (the shared-prompt forward,
// Qwen2ModelImpl::forward_shared): rows whose first prompt_lengths[b] tokens are the same (a group's G responses)
// share them; every other position is each row's own. The logits at a prompt's last position, which predict each of
// its rows' first response token, are computed once too. Rows right-padded; every loss_mask target must be a response
// token (position >= prompt length - 1): std::invalid_argument naming the row otherwise. The same log-probs (and
// entropy) as target_logprobs within rounding: the products are the same, summed in another order.
TargetLogprobs shared_prompt_target_logprobs(Qwen2ForCausalLM& model, const torch::Tensor& input_ids,
                                             const torch::Tensor& attention_mask, const torch::Tensor& loss_mask,
                                             const std::vector<int64_t>& prompt_lengths, const LogprobOptions& options);

// The same, scattered back to [B, L - 1] with 0 outside loss_mask (entropy too).
TargetLogprobs response_logprobs(Qwen2ForCausalLM& model, const torch::Tensor& input_ids,
                                 const torch::Tensor& attention_mask, const torch::Tensor& loss_mask,
                                 const LogprobOptions& options);
TargetLogprobs shared_prompt_response_logprobs(Qwen2ForCausalLM& model, const torch::Tensor& input_ids,
                                               const torch::Tensor& attention_mask, const torch::Tensor& loss_mask,
                                               const std::vector<int64_t>& prompt_lengths,
                                               const LogprobOptions& options);

}  // namespace qwen
