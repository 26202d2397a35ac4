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
#include "qwen_gsm8k/model/host_door.hpp"

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

namespace {

using host_door::on_device;
using host_door::on_host;

// The loss_mask [B, L - 1] targets' flat positions b * (L - 1) + t in row-major order, found on the host and copied to
// `device` (a boolean index there would wait for the device to count them).
torch::Tensor target_positions(const torch::Tensor& host_loss_mask, torch::Device device) {
  return on_device(host_loss_mask.to(torch::kBool).reshape(-1).nonzero().reshape(-1), device);
}

// values [N] of the targets at `positions` scattered back to [B, L - 1], 0 elsewhere (differentiable).
torch::Tensor scattered(const torch::Tensor& values, const torch::Tensor& positions, at::IntArrayRef shape) {
  return torch::zeros({shape[0] * shape[1]}, values.options()).index_copy(0, positions, values).view(shape);
}

TargetLogprobs scattered(TargetLogprobs out, const torch::Tensor& positions, at::IntArrayRef shape) {
  out.logp = scattered(out.logp, positions, shape);
  if (out.entropy.defined()) out.entropy = scattered(out.entropy, positions, shape);
  return out;
}

// Every token id of the rows [B, L] (host) below the vocabulary's size, so that the device's gathers stay in range.
void check_token_ids(const torch::Tensor& host_ids, int64_t vocab, const char* where) {
  if (host_ids.numel() == 0) return;
  const torch::Tensor bad = (host_ids < 0) | (host_ids >= vocab);
  if (!bad.any().item<bool>()) return;
  const torch::Tensor at = bad.nonzero()[0];
  throw std::invalid_argument(
      std::string(where) + ": token id " + std::to_string(host_ids.index({at[0], at[1]}).item<int64_t>()) + " at row " +
      std::to_string(at[0].item<int64_t>()) + ", position " + std::to_string(at[1].item<int64_t>()) +
      " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
}

// The targets' log-probs [N] from the positions' hidden states [N, H] (float32 softmax; the product in the autocast
// dtype).
TargetLogprobs lm_head_logprobs(Qwen2ForCausalLM& model, const torch::Tensor& selected, const torch::Tensor& targets,
                                const LogprobOptions& options) {
  torch::Tensor lm_head = model->lm_head_weight();
  if (options.autocast) lm_head = cast_weight(lm_head, *options.autocast);  // the WeightCastScope's, where one is open
  const auto cast = [&](const torch::Tensor& x) { return options.autocast ? x.to(*options.autocast) : x; };
  const auto out = dapo::linear_logprobs(cast(selected), lm_head, targets,
                                         {.chunk_size = options.chunk_size,
                                          .temperature = options.temperature,
                                          .with_entropy = options.with_entropy,
                                          .check_targets = false});  // checked on the host (check_token_ids)
  TargetLogprobs result{out.logp, out.entropy, {}};
  if (options.with_entropy) result.entropy_sum = out.entropy.detach().sum();
  return result;
}

// target_logprobs of the targets at `positions` (target_positions of the loss mask).
TargetLogprobs logprobs_at(Qwen2ForCausalLM& model, const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                           const torch::Tensor& positions, const LogprobOptions& options) {
  const auto device = model->lm_head_weight().device();
  const torch::Tensor host_ids = on_host(input_ids), host_attention = on_host(attention_mask);
  check_token_ids(host_ids, model->lm_head_weight().size(0), "target_logprobs");
  const torch::Tensor ids = on_device(host_ids, device), mask = on_device(host_attention, device);
  torch::Tensor hidden;
  {
    const AutocastGuard autocast(device, options.autocast);
    // Training rows are prompt then response, padded on the right: causal attention needs no padding mask there,
    // which lets a fused attention kernel take the forward (decided from the host's values).
    hidden = right_padded(host_attention)
                 ? model->right_padded_hidden_states(ids, mask, position_ids_from_mask(mask))  // [B, L, H]
                 : model->hidden_states(ids, mask, position_ids_from_mask(mask));
  }
  // Target b * (L - 1) + t is predicted by the hidden state at b * L + t and is the token at b * L + t + 1.
  const torch::Tensor read_at = positions + positions.div(ids.size(1) - 1, "floor");
  const torch::Tensor selected = hidden.reshape({-1, hidden.size(-1)}).index_select(0, read_at);  // [N, H]
  return lm_head_logprobs(model, selected, ids.reshape(-1).index_select(0, read_at + 1), options);
}

}  // namespace

TargetLogprobs target_logprobs(Qwen2ForCausalLM& model, const torch::Tensor& input_ids,
                               const torch::Tensor& attention_mask, const torch::Tensor& loss_mask,
                               const LogprobOptions& options) {
  const torch::Tensor positions = target_positions(on_host(loss_mask), model->lm_head_weight().device());
  return logprobs_at(model, input_ids, attention_mask, positions, options);
}

TargetLogprobs response_logprobs(Qwen2ForCausalLM& model, const torch::Tensor& input_ids,
                                 const torch::Tensor& attention_mask, const torch::Tensor& loss_mask,
                                 const LogprobOptions& options) {
  const torch::Tensor positions = target_positions(on_host(loss_mask), model->lm_head_weight().device());
  return scattered(logprobs_at(model, input_ids, attention_mask, positions, options), positions, loss_mask.sizes());
}

TargetLogprobs shared_prompt_response_logprobs(Qwen2ForCausalLM& model, const torch::Tensor& input_ids,
                                               const torch::Tensor& attention_mask, const torch::Tensor& loss_mask,
                                               const std::vector<int64_t>& prompt_lengths,
                                               const LogprobOptions& options) {
  const auto device = model->lm_head_weight().device();
  return scattered(shared_prompt_target_logprobs(model, input_ids, attention_mask, loss_mask, prompt_lengths, options),
                   target_positions(on_host(loss_mask), device), loss_mask.sizes());
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
  const torch::Tensor ids = on_host(input_ids).to(torch::kInt64).contiguous();
  const torch::Tensor real = on_host(attention_mask).to(torch::kInt64).contiguous();
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

// The shared-prompt form of a batch and its targets' positions, from host tensors (nothing here waits for a device).
SharedTargets shared_targets(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                             const torch::Tensor& loss_mask, const std::vector<int64_t>& prompt_lengths) {
  SharedTargets out;
  out.batch = shared_prompt_batch(input_ids, attention_mask, prompt_lengths);
  const torch::Tensor ids = input_ids.to(torch::kInt64).contiguous();
  const torch::Tensor targets = loss_mask.to(torch::kBool).contiguous();
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

TargetLogprobs shared_prompt_target_logprobs(Qwen2ForCausalLM& model, const torch::Tensor& input_ids,
                                             const torch::Tensor& attention_mask, const torch::Tensor& loss_mask,
                                             const std::vector<int64_t>& prompt_lengths,
                                             const LogprobOptions& options) {
  const torch::Tensor host_ids = on_host(input_ids), host_attention = on_host(attention_mask);
  const SharedTargets targets = shared_targets(host_ids, host_attention, on_host(loss_mask), prompt_lengths);
  if (targets.order.empty()) {  // no targets: target_logprobs's empty result, tied to the weights as there
    return target_logprobs(model, host_ids, host_attention, loss_mask, options);
  }
  check_token_ids(host_ids, model->lm_head_weight().size(0), "shared-prompt log-probs");
  const auto device = model->lm_head_weight().device();
  const auto index = [&](const std::vector<int64_t>& values) { return host_door::to_device(values, device); };
  torch::Tensor hidden;  // [packed tokens, H]
  {
    const AutocastGuard autocast(device, options.autocast);
    hidden = model->model->forward_shared(targets.batch);
  }
  torch::Tensor lm_head = model->lm_head_weight();
  if (options.autocast) lm_head = cast_weight(lm_head, *options.autocast);  // as target_logprobs: in that dtype
  const auto cast = [&](const torch::Tensor& x) { return options.autocast ? x.to(*options.autocast) : x; };
  std::vector<torch::Tensor> logp, entropies;
  if (!targets.first_prompt.empty()) {
    // The logits of each prompt's last position once [prompts, V], log-softmax in float32 (float64 for float64), then
    // one value per row that reads it.
    const torch::Tensor logits = at::linear(cast(hidden.index_select(0, index(targets.last_rows))), lm_head);
    const torch::Tensor scaled =
        logits.to(logits.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32) / options.temperature;
    const torch::Tensor all = torch::log_softmax(scaled, -1);
    const torch::Tensor which = index(targets.first_prompt);
    logp.push_back(all.index({which, index(targets.first_token)}));
    if (options.with_entropy) entropies.push_back((-(all.exp() * all).sum(-1)).index_select(0, which));
  }
  if (!targets.rest_rows.empty()) {
    const auto out = dapo::linear_logprobs(cast(hidden.index_select(0, index(targets.rest_rows))), lm_head,
                                           index(targets.rest_token),
                                           {.chunk_size = options.chunk_size,
                                            .temperature = options.temperature,
                                            .with_entropy = options.with_entropy,
                                            .check_targets = false});  // checked on the host (check_token_ids)
    logp.push_back(out.logp);
    if (options.with_entropy) entropies.push_back(out.entropy);
  }
  const torch::ScalarType dtype = logp.back().scalar_type();
  for (auto& part : logp) part = part.to(dtype);
  for (auto& part : entropies) part = part.to(dtype);
  const torch::Tensor order = index(targets.order);
  TargetLogprobs out{torch::cat(logp).index_select(0, order), {}, {}};
  if (options.with_entropy) {
    out.entropy = torch::cat(entropies).index_select(0, order);
    out.entropy_sum = out.entropy.detach().sum();
  }
  return out;
}

}  // namespace qwen
