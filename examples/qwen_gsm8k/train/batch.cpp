// Padded batches and their log-probs.
#include "qwen_gsm8k/train/batch.hpp"

#include <dapo/advantage.hpp>
#include <dapo/core/advantage_estimator.hpp>
#include <dapo/logprob.hpp>

#include <algorithm>

#include "qwen_gsm8k/model/autocast.hpp"

namespace qwen {

PaddedBatch pad_rows(const std::vector<BatchRow>& rows, int64_t pad_id) {
  int64_t longest = 0;
  for (const auto& row : rows) longest = std::max<int64_t>(longest, static_cast<int64_t>(row.tokens.size()));
  const auto count = static_cast<int64_t>(rows.size());
  PaddedBatch batch;
  batch.input_ids = torch::full({count, longest}, pad_id, torch::kInt64);
  batch.attention_mask = torch::zeros({count, longest}, torch::kInt64);
  batch.loss_mask = torch::zeros({count, longest - 1}, torch::kBool);
  for (int64_t r = 0; r < count; ++r) {
    const BatchRow& row = rows[static_cast<std::size_t>(r)];
    const auto length = static_cast<int64_t>(row.tokens.size());
    batch.input_ids[r].narrow(0, 0, length).copy_(torch::tensor(row.tokens, torch::kInt64));
    batch.attention_mask[r].narrow(0, 0, length).fill_(1);
    const int64_t response = length - row.prompt_length;
    if (row.in_loss && response > 0) batch.loss_mask[r].narrow(0, row.prompt_length - 1, response).fill_(true);
  }
  return batch;
}

namespace {

// One advantage per response by a verl estimator: rewards [B, L] with each score on its response's last token, the
// responses' masks, and each group as one prompt. Outcome rewards with no discount make every estimator's value the
// same on all of a response's tokens; the first one is taken.
torch::Tensor estimated_advantages(const std::vector<Group>& groups, const std::vector<double>& rewards,
                                   const dapo::AdvantageOptions& advantage, dapo::AdvantageEstimator estimator) {
  std::vector<int64_t> lengths, index;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    for (const auto& response : groups[g].responses) {
      lengths.push_back(std::max<int64_t>(static_cast<int64_t>(response.ids.size()), 1));
      index.push_back(static_cast<int64_t>(g));
    }
  }
  const auto rows = static_cast<int64_t>(lengths.size());
  const int64_t cols = lengths.empty() ? 0 : *std::max_element(lengths.begin(), lengths.end());
  std::vector<double> token_rewards(static_cast<std::size_t>(rows * cols), 0.0), mask(token_rewards.size(), 0.0);
  for (int64_t b = 0; b < rows; ++b) {
    const int64_t length = lengths[static_cast<std::size_t>(b)];
    for (int64_t t = 0; t < length; ++t) mask[static_cast<std::size_t>(b * cols + t)] = 1.0;
    token_rewards[static_cast<std::size_t>(b * cols + length - 1)] = rewards[static_cast<std::size_t>(b)];
  }
  std::vector<double> values(token_rewards.size());
  dapo::core::estimate_advantages<double>(
      token_rewards, mask, index, rows, cols,
      {.estimator = estimator, .norm_adv_by_std = advantage.scale_by_std, .epsilon = advantage.epsilon}, values);
  std::vector<double> per_row;
  for (int64_t b = 0; b < rows; ++b) per_row.push_back(values[static_cast<std::size_t>(b * cols)]);
  return torch::tensor(per_row, torch::kFloat64);
}

}  // namespace

TrainBatch build_train_batch(const std::vector<Group>& groups, int64_t group_size, int64_t pad_id, bool mask_truncated,
                             const dapo::AdvantageOptions& advantage, dapo::AdvantageEstimator estimator) {
  std::vector<BatchRow> rows;
  std::vector<double> rewards;
  for (const auto& group : groups) {
    for (const auto& response : group.responses) {
      BatchRow row{group.prompt, static_cast<int64_t>(group.prompt.size()), !(mask_truncated && response.truncated)};
      row.tokens.insert(row.tokens.end(), response.ids.begin(), response.ids.end());
      rows.push_back(std::move(row));
      rewards.push_back(response.score.total);
    }
  }
  TrainBatch batch;
  batch.padded = pad_rows(rows, pad_id);
  bool recorded = true;
  for (const auto& group : groups) {
    for (const auto& response : group.responses) recorded = recorded && response.logprobs.size() == response.ids.size();
  }
  if (recorded) {  // response token k of a row sits at prompt_length + k, predicted from position prompt_length + k - 1
    batch.rollout_logp = torch::zeros(batch.padded.loss_mask.sizes(), torch::kFloat32);
    int64_t row = 0;
    for (const auto& group : groups) {
      for (const auto& response : group.responses) {
        const auto count = static_cast<int64_t>(response.logprobs.size());
        if (count > 0) {
          batch.rollout_logp[row]
              .narrow(0, static_cast<int64_t>(group.prompt.size()) - 1, count)
              .copy_(torch::tensor(response.logprobs, torch::kFloat32));
        }
        ++row;
      }
    }
  }
  batch.groups = static_cast<int64_t>(groups.size());
  batch.group_size = group_size;
  batch.advantages = (estimator == dapo::AdvantageEstimator::kGrpo
                          ? dapo::group_advantages(torch::tensor(rewards, torch::kFloat64), group_size, advantage)
                          : estimated_advantages(groups, rewards, advantage, estimator))
                         .to(torch::kFloat32);
  return batch;
}

torch::Tensor target_logprobs(Qwen2ForCausalLM& model, const torch::Tensor& input_ids,
                              const torch::Tensor& attention_mask, const torch::Tensor& loss_mask,
                              const LogprobOptions& options, double* entropy_sum, torch::Tensor* entropy) {
  const auto device = model->lm_head_weight().device();
  const torch::Tensor ids = input_ids.to(device), mask = attention_mask.to(device), targets_mask = loss_mask.to(device);
  torch::Tensor hidden;
  {
    const AutocastGuard autocast(device, options.autocast);
    // Training rows are prompt then response, padded on the right: causal attention needs no padding mask there,
    // which lets a fused attention kernel take the forward (read from the host copy, no device synchronisation).
    hidden = right_padded(attention_mask.cpu())
                 ? model->right_padded_hidden_states(ids, mask, position_ids_from_mask(mask))  // [B, L, H]
                 : model->hidden_states(ids, mask, position_ids_from_mask(mask));
  }
  const int64_t steps = ids.size(1) - 1;
  torch::Tensor selected = hidden.narrow(1, 0, steps).index({targets_mask});  // [N, H]
  torch::Tensor lm_head = model->lm_head_weight();
  if (options.autocast) {  // the lm-head product in the autocast dtype too; linear_logprobs keeps its softmax float32
    selected = selected.to(*options.autocast);
    lm_head = lm_head.to(*options.autocast);
  }
  const torch::Tensor targets = ids.narrow(1, 1, steps).index({targets_mask});  // [N]
  const auto out = dapo::linear_logprobs(selected, lm_head, targets,
                                         {.chunk_size = options.chunk_size,
                                          .temperature = options.temperature,
                                          .with_entropy = entropy_sum != nullptr || entropy != nullptr});
  if (entropy_sum != nullptr) *entropy_sum += out.entropy.detach().sum().item<double>();
  if (entropy != nullptr) *entropy = out.entropy;
  return out.logp;
}

torch::Tensor response_logprobs(Qwen2ForCausalLM& model, const torch::Tensor& input_ids,
                                const torch::Tensor& attention_mask, const torch::Tensor& loss_mask,
                                const LogprobOptions& options, double* entropy_sum, torch::Tensor* entropy) {
  const torch::Tensor logp =
      target_logprobs(model, input_ids, attention_mask, loss_mask, options, entropy_sum, entropy);
  const torch::Tensor targets_mask = loss_mask.to(logp.device());
  if (entropy != nullptr) {
    *entropy = torch::zeros(targets_mask.sizes(), entropy->options()).masked_scatter(targets_mask, *entropy);
  }
  return torch::zeros(targets_mask.sizes(), logp.options()).masked_scatter(targets_mask, logp);
}

}  // namespace qwen
