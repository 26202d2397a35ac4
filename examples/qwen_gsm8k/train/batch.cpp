// Padded batches and their log-probs.
#include "qwen_gsm8k/train/batch.hpp"

#include <dapo/advantage.hpp>
#include <dapo/core/advantage_estimator.hpp>
#include <dapo/logprob.hpp>

#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>

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
  batch.prompt_lengths.reserve(rows.size());
  for (int64_t r = 0; r < count; ++r) {
    const BatchRow& row = rows[static_cast<std::size_t>(r)];
    const auto length = static_cast<int64_t>(row.tokens.size());
    batch.input_ids[r].narrow(0, 0, length).copy_(torch::tensor(row.tokens, torch::kInt64));
    batch.attention_mask[r].narrow(0, 0, length).fill_(1);
    batch.prompt_lengths.push_back(row.prompt_length);
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

namespace {

// values [N] (and the entropy [N]) of the loss_mask targets scattered back to [B, L - 1], 0 elsewhere.
torch::Tensor scattered(const torch::Tensor& values, const torch::Tensor& loss_mask, torch::Tensor* entropy) {
  const torch::Tensor targets_mask = loss_mask.to(values.device());
  if (entropy != nullptr) {
    *entropy = torch::zeros(targets_mask.sizes(), entropy->options()).masked_scatter(targets_mask, *entropy);
  }
  return torch::zeros(targets_mask.sizes(), values.options()).masked_scatter(targets_mask, values);
}

}  // namespace

torch::Tensor response_logprobs(Qwen2ForCausalLM& model, const torch::Tensor& input_ids,
                                const torch::Tensor& attention_mask, const torch::Tensor& loss_mask,
                                const LogprobOptions& options, double* entropy_sum, torch::Tensor* entropy) {
  return scattered(target_logprobs(model, input_ids, attention_mask, loss_mask, options, entropy_sum, entropy),
                   loss_mask, entropy);
}

torch::Tensor shared_prompt_response_logprobs(Qwen2ForCausalLM& model, const torch::Tensor& input_ids,
                                              const torch::Tensor& attention_mask, const torch::Tensor& loss_mask,
                                              const std::vector<int64_t>& prompt_lengths, const LogprobOptions& options,
                                              double* entropy_sum, torch::Tensor* entropy) {
  return scattered(shared_prompt_target_logprobs(model, input_ids, attention_mask, loss_mask, prompt_lengths, options,
                                                 entropy_sum, entropy),
                   loss_mask, entropy);
}

namespace {

// Where each loss_mask target of a shared-prompt forward reads its hidden state: the first response token of a row
// from its prompt's last position (one lm-head row per prompt, used by every row that needs it), every other one
// from the row's own response positions.
struct SharedTargets {
  SharedPromptBatch batch;
  std::vector<int64_t> first_prompt, first_token;  // per first-token target: its prompt's index among `last_rows`
  std::vector<int64_t> last_rows;                  // packed rows of the prompts' last positions that are read
  std::vector<int64_t> rest_rows, rest_token;      // per other target: its packed row and its token
  std::vector<int64_t> order;  // target i (loss_mask order) is entry order[i] of [first targets, other targets]
};

// Each row's real tokens, checking the rows are right-padded and their prompts within them.
std::vector<int64_t> row_lengths(const torch::TensorAccessor<int64_t, 2>& is_real,
                                 const std::vector<int64_t>& prompt_lengths) {
  const auto rows = static_cast<int64_t>(is_real.size(0)), width = static_cast<int64_t>(is_real.size(1));
  if (static_cast<int64_t>(prompt_lengths.size()) != rows) {
    throw std::invalid_argument("shared-prompt log-probs: " + std::to_string(prompt_lengths.size()) +
                                " prompt lengths for " + std::to_string(rows) + " rows");
  }
  std::vector<int64_t> lengths;
  for (int64_t b = 0; b < rows; ++b) {
    int64_t length = 0;
    while (length < width && is_real[b][length] != 0) ++length;
    for (int64_t s = length; s < width; ++s) {
      if (is_real[b][s] != 0) {
        throw std::invalid_argument("shared-prompt log-probs: row " + std::to_string(b) +
                                    " has a real token after padding (rows must be right-padded)");
      }
    }
    const int64_t prompt = prompt_lengths[static_cast<std::size_t>(b)];
    if (prompt < 1 || prompt > length) {
      throw std::invalid_argument("shared-prompt log-probs: row " + std::to_string(b) + " has a prompt of " +
                                  std::to_string(prompt) + " tokens but " + std::to_string(length) +
                                  " real tokens (expected 1 <= prompt <= real)");
    }
    lengths.push_back(length);
  }
  return lengths;
}

}  // namespace

SharedPromptBatch shared_prompt_batch(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                                      const std::vector<int64_t>& prompt_lengths) {
  const torch::Tensor ids = input_ids.to(torch::kCPU, torch::kInt64).contiguous();
  const torch::Tensor real = attention_mask.to(torch::kCPU, torch::kInt64).contiguous();
  const auto id = ids.accessor<int64_t, 2>();
  const std::vector<int64_t> lengths = row_lengths(real.accessor<int64_t, 2>(), prompt_lengths);
  const int64_t rows = ids.size(0);
  // One index per distinct prompt (its tokens), in order of first appearance.
  std::vector<int64_t> row_prompt(static_cast<std::size_t>(rows));
  std::map<std::vector<int64_t>, int64_t> prompt_index;
  std::vector<const std::vector<int64_t>*> prompts;
  int64_t prompt_width = 1, response_width = 0;
  for (int64_t b = 0; b < rows; ++b) {
    const int64_t prompt = prompt_lengths[static_cast<std::size_t>(b)];
    std::vector<int64_t> tokens(static_cast<std::size_t>(prompt));
    for (int64_t s = 0; s < prompt; ++s) tokens[static_cast<std::size_t>(s)] = id[b][s];
    const auto [it, inserted] = prompt_index.emplace(std::move(tokens), static_cast<int64_t>(prompts.size()));
    if (inserted) prompts.push_back(&it->first);
    row_prompt[static_cast<std::size_t>(b)] = it->second;
    prompt_width = std::max(prompt_width, prompt);
    response_width = std::max(response_width, lengths[static_cast<std::size_t>(b)] - prompt);
  }
  SharedPromptBatch out;
  const auto prompt_count = static_cast<int64_t>(prompts.size());
  out.prompt_ids = torch::zeros({prompt_count, prompt_width}, torch::kInt64);
  out.prompt_lengths = torch::zeros({prompt_count}, torch::kInt64);
  for (int64_t p = 0; p < prompt_count; ++p) {
    const std::vector<int64_t>& tokens = *prompts[static_cast<std::size_t>(p)];
    const auto count = static_cast<int64_t>(tokens.size());
    out.prompt_ids[p].narrow(0, 0, count).copy_(torch::tensor(tokens, torch::kInt64));
    out.prompt_lengths[p] = count;
  }
  out.response_ids = torch::zeros({rows, response_width}, torch::kInt64);
  out.response_lengths = torch::zeros({rows}, torch::kInt64);
  for (int64_t b = 0; b < rows; ++b) {
    const int64_t prompt = prompt_lengths[static_cast<std::size_t>(b)];
    const int64_t response = lengths[static_cast<std::size_t>(b)] - prompt;
    if (response > 0) out.response_ids[b].narrow(0, 0, response).copy_(ids[b].narrow(0, prompt, response));
    out.response_lengths[b] = response;
  }
  out.row_prompt = torch::tensor(row_prompt, torch::kInt64);
  return out;
}

namespace {

// The int64 values of a 1-d host tensor.
std::vector<int64_t> values_of(const torch::Tensor& tensor) {
  return {tensor.data_ptr<int64_t>(), tensor.data_ptr<int64_t>() + tensor.numel()};
}

SharedTargets shared_targets(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                             const torch::Tensor& loss_mask, const std::vector<int64_t>& prompt_lengths) {
  SharedTargets out;
  out.batch = shared_prompt_batch(input_ids, attention_mask, prompt_lengths);
  const torch::Tensor ids = input_ids.to(torch::kCPU, torch::kInt64).contiguous();
  const torch::Tensor targets = loss_mask.to(torch::kCPU, torch::kBool).contiguous();
  const auto id = ids.accessor<int64_t, 2>();
  const auto is_target = targets.accessor<bool, 2>();
  const std::vector<int64_t> row_prompt = values_of(out.batch.row_prompt);
  const std::vector<int64_t> responses = values_of(out.batch.response_lengths);
  const int64_t rows = ids.size(0), width = ids.size(1);
  // Where each prompt's and each row's response's tokens start among the packed ones (Qwen2ModelImpl::forward_shared).
  std::vector<int64_t> prompt_start, response_start;
  int64_t packed = 0;
  for (const int64_t length : values_of(out.batch.prompt_lengths)) {
    prompt_start.push_back(packed);
    packed += length;
  }
  for (const int64_t length : responses) {
    response_start.push_back(packed);
    packed += length;
  }
  // The targets in loss_mask's row-major order.
  std::map<int64_t, int64_t> last_index;          // prompt -> its index in last_rows
  std::vector<std::pair<bool, int64_t>> sources;  // (first token?, index in its list)
  for (int64_t b = 0; b < rows; ++b) {
    const int64_t prompt = prompt_lengths[static_cast<std::size_t>(b)];
    for (int64_t t = 0; t < width - 1; ++t) {
      if (!is_target[b][t]) continue;
      const int64_t end = prompt + responses[static_cast<std::size_t>(b)];  // the row's real tokens
      if (t < prompt - 1 || t + 1 >= end) {
        throw std::invalid_argument("shared-prompt log-probs: row " + std::to_string(b) + " has a loss target at " +
                                    std::to_string(t + 1) + ", outside its response (tokens " + std::to_string(prompt) +
                                    " to " + std::to_string(end - 1) + ")");
      }
      if (t == prompt - 1) {
        const int64_t p = row_prompt[static_cast<std::size_t>(b)];
        const auto [it, inserted] = last_index.emplace(p, static_cast<int64_t>(out.last_rows.size()));
        if (inserted) out.last_rows.push_back(prompt_start[static_cast<std::size_t>(p)] + prompt - 1);
        sources.emplace_back(true, static_cast<int64_t>(out.first_prompt.size()));
        out.first_prompt.push_back(it->second);
        out.first_token.push_back(id[b][t + 1]);
      } else {
        sources.emplace_back(false, static_cast<int64_t>(out.rest_rows.size()));
        out.rest_rows.push_back(response_start[static_cast<std::size_t>(b)] + (t - prompt));
        out.rest_token.push_back(id[b][t + 1]);
      }
    }
  }
  const auto firsts = static_cast<int64_t>(out.first_prompt.size());
  for (const auto& [first, index] : sources) out.order.push_back(first ? index : firsts + index);
  return out;
}

}  // namespace

torch::Tensor shared_prompt_target_logprobs(Qwen2ForCausalLM& model, const torch::Tensor& input_ids,
                                            const torch::Tensor& attention_mask, const torch::Tensor& loss_mask,
                                            const std::vector<int64_t>& prompt_lengths, const LogprobOptions& options,
                                            double* entropy_sum, torch::Tensor* entropy) {
  const SharedTargets targets = shared_targets(input_ids, attention_mask, loss_mask, prompt_lengths);
  if (targets.order.empty()) {  // no targets: target_logprobs's empty result, tied to the weights as there
    return target_logprobs(model, input_ids, attention_mask, loss_mask, options, entropy_sum, entropy);
  }
  const auto device = model->lm_head_weight().device();
  const auto on = torch::TensorOptions().device(device).dtype(torch::kInt64);
  torch::Tensor hidden;  // [packed tokens, H]
  {
    const AutocastGuard autocast(device, options.autocast);
    hidden = model->model->forward_shared(targets.batch);
  }
  torch::Tensor lm_head = model->lm_head_weight();
  if (options.autocast) lm_head = lm_head.to(*options.autocast);  // as target_logprobs: the product in that dtype
  const auto cast = [&](const torch::Tensor& x) { return options.autocast ? x.to(*options.autocast) : x; };
  const bool with_entropy = entropy_sum != nullptr || entropy != nullptr;
  std::vector<torch::Tensor> logp, entropies;
  if (!targets.first_prompt.empty()) {
    // The logits of each prompt's last position once [prompts, V], log-softmax in float32 (float64 for float64), then
    // one value per row that reads it.
    const torch::Tensor logits =
        at::linear(cast(hidden.index_select(0, torch::tensor(targets.last_rows, on))), lm_head);
    const torch::Tensor scaled =
        logits.to(logits.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32) / options.temperature;
    const torch::Tensor all = torch::log_softmax(scaled, -1);
    const torch::Tensor which = torch::tensor(targets.first_prompt, on);
    logp.push_back(all.index({which, torch::tensor(targets.first_token, on)}));
    if (with_entropy) entropies.push_back((-(all.exp() * all).sum(-1)).index_select(0, which));
  }
  if (!targets.rest_rows.empty()) {
    const auto out = dapo::linear_logprobs(
        cast(hidden.index_select(0, torch::tensor(targets.rest_rows, on))), lm_head,
        torch::tensor(targets.rest_token, on),
        {.chunk_size = options.chunk_size, .temperature = options.temperature, .with_entropy = with_entropy});
    logp.push_back(out.logp);
    if (with_entropy) entropies.push_back(out.entropy);
  }
  const torch::ScalarType dtype = logp.back().scalar_type();
  for (auto& part : logp) part = part.to(dtype);
  for (auto& part : entropies) part = part.to(dtype);
  const torch::Tensor order = torch::tensor(targets.order, on);
  if (with_entropy) {
    const torch::Tensor values = torch::cat(entropies).index_select(0, order);
    if (entropy_sum != nullptr) *entropy_sum += values.detach().sum().item<double>();
    if (entropy != nullptr) *entropy = values;
  }
  return torch::cat(logp).index_select(0, order);
}

}  // namespace qwen
