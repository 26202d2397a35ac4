// The policy update of a step: old log-probs, mini-batch updates, the step's update metrics.
#include "qwen_gsm8k/train/update.hpp"

#include <dapo/aggregation.hpp>
#include <dapo/kl_penalty.hpp>
#include <dapo/loss.hpp>
#include <dapo/rollout_correction.hpp>

#include <ATen/record_function.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <string>

#include "qwen_gsm8k/model/autocast.hpp"
#include "qwen_gsm8k/model/host_door.hpp"

namespace qwen {

// This rank's parts of the step's sums, all-reduced at the end.
struct PolicyUpdate::Sums {
  double dual_clipped = 0, kl = 0, loss = 0, grad_norm = 0, entropy = 0, lr = 0, kl_loss = 0;
  double entropy_tokens = 0;                                // the loss tokens the old policy's entropy was taken on
  int64_t skipped = 0;                                      // updates whose gradient norm was not finite
  std::vector<double> clipped_by_update, tokens_by_update;  // clipped tokens and all tokens, per update
  // The entropy of each micro-batch under the old policy (0-d, on the device), in plan order (the first mini-batch's
  // come from its first update): read after the updates and added up in that order into `entropy`.
  std::vector<std::vector<torch::Tensor>> entropy_by_micro_batch;
};

namespace {

// The rows as an index on `device`: made on the host, copied through host_door where the device is not the CPU.
torch::Tensor row_index(const std::vector<int64_t>& rows, torch::Device device) {
  return device.is_cpu() ? torch::tensor(rows, torch::kInt64) : host_door::to_device(rows, device);
}

}  // namespace

torch::Tensor MicroBatch::take(const torch::Tensor& tensor) const {
  if (rows.empty()) return tensor.narrow(0, 0, 0);
  if (rows.back() - rows.front() + 1 == static_cast<int64_t>(rows.size())) {
    return tensor.narrow(0, rows.front(), static_cast<int64_t>(rows.size()));
  }
  return tensor.index_select(0, row_index(rows, tensor.device()));
}

void MicroBatch::put(const torch::Tensor& into, const torch::Tensor& values) const {
  const torch::Tensor source = values.to(into.device(), into.scalar_type());
  into.narrow(1, 0, values.size(1)).index_copy_(0, row_index(rows, into.device()), source);
}

MicroBatching MicroBatching::from(const TrainOptions& options) {
  MicroBatching cut;
  cut.mini_groups = options.ppo_mini_batch_size;
  cut.micro_groups = options.ppo_micro_batch_size > 0 ? options.ppo_micro_batch_size : cut.mini_groups;
  if (options.use_dynamic_bsz) {
    cut.max_tokens = options.ppo_max_token_len_per_gpu;
    cut.logprob_max_tokens = options.log_prob_max_token_len_per_gpu;
  }
  return cut;
}

std::vector<std::vector<int64_t>> pack_rows_by_tokens(const std::vector<int64_t>& row_ids,
                                                      const std::vector<int64_t>& lengths, int64_t max_tokens,
                                                      const char* where) {
  if (row_ids.size() != lengths.size()) {
    throw std::invalid_argument(std::string(where) + ": " + std::to_string(row_ids.size()) + " rows but " +
                                std::to_string(lengths.size()) + " lengths");
  }
  std::vector<std::size_t> order(row_ids.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  // Longest first (ties in row order): a micro-batch then pads its rows to its first one's length.
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return lengths[a] > lengths[b]; });
  std::vector<std::vector<int64_t>> packs;
  int64_t longest = 0;
  for (const std::size_t i : order) {
    if (lengths[i] > max_tokens) {
      throw std::invalid_argument(std::string(where) + " is " + std::to_string(max_tokens) + " tokens, but row " +
                                  std::to_string(row_ids[i]) + " holds " + std::to_string(lengths[i]) +
                                  " (prompt + response): a micro-batch holds at least one whole row, so raise the "
                                  "budget to at least " +
                                  std::to_string(lengths[i]));
    }
    const auto rows = packs.empty() ? int64_t{0} : static_cast<int64_t>(packs.back().size());
    if (packs.empty() || (rows + 1) * longest > max_tokens) {
      packs.emplace_back();
      longest = lengths[i];
    }
    packs.back().push_back(row_ids[i]);
  }
  for (auto& pack : packs) std::sort(pack.begin(), pack.end());
  return packs;
}

namespace {

// The rows' real tokens (prompt + response): each row's attention mask sum.
std::vector<int64_t> row_lengths(const TrainBatch& batch, int64_t first_row, int64_t rows) {
  const torch::Tensor sums =
      batch.padded.attention_mask.narrow(0, first_row, rows).sum(1).to(torch::kInt64).contiguous();
  return {sums.data_ptr<int64_t>(), sums.data_ptr<int64_t>() + rows};
}

// Rows [first_row, first_row + rows), cut into micro-batches by a token budget or, without one (0), micro_rows rows at
// a time.
std::vector<MicroBatch> cut_share(const TrainBatch& batch, int64_t first_row, int64_t rows, int64_t micro_rows,
                                  int64_t max_tokens, const char* where) {
  const std::vector<int64_t> lengths = row_lengths(batch, first_row, rows);
  std::vector<int64_t> row_ids(static_cast<std::size_t>(rows));
  std::iota(row_ids.begin(), row_ids.end(), first_row);
  std::vector<std::vector<int64_t>> packs;
  if (max_tokens > 0) {
    packs = pack_rows_by_tokens(row_ids, lengths, max_tokens, where);
  } else {
    for (int64_t row = 0; row < rows; row += micro_rows) {
      packs.emplace_back(row_ids.begin() + row, row_ids.begin() + std::min(row + micro_rows, rows));
    }
  }
  std::vector<MicroBatch> micro_batches;
  for (auto& pack : packs) {
    MicroBatch micro{std::move(pack), 0};
    // The longest real row of the micro-batch: its columns beyond are padding in every row.
    for (const int64_t row : micro.rows) micro.length = std::max(micro.length, lengths[row - first_row]);
    micro_batches.push_back(std::move(micro));
  }
  return micro_batches;
}

}  // namespace

std::vector<MiniBatch> plan_mini_batches(const TrainBatch& batch, const MicroBatching& cut, int64_t own_begin,
                                         int64_t own_end) {
  const int64_t group_size = batch.group_size;
  std::vector<MiniBatch> plan;
  for (int64_t first_group = 0; first_group + cut.mini_groups <= batch.groups; first_group += cut.mini_groups) {
    MiniBatch mini{first_group * group_size, cut.mini_groups * group_size, {}, {}, {}};
    // Counted once here, not in each of the ppo_epochs updates of this mini-batch.
    mini.counts = dapo::count_mini_batch(batch.padded.loss_mask.narrow(0, mini.first_row, mini.rows));
    const int64_t share_first = (first_group + own_begin) * group_size, share_rows = (own_end - own_begin) * group_size;
    mini.micro_batches = cut_share(batch, share_first, share_rows, cut.micro_groups * group_size, cut.max_tokens,
                                   "ppo_max_token_len_per_gpu");
    mini.logprob_micro_batches =
        cut.max_tokens > 0 && cut.logprob_max_tokens > 0
            ? cut_share(batch, share_first, share_rows, 0, cut.logprob_max_tokens, "log_prob_max_token_len_per_gpu")
            : mini.micro_batches;
    plan.push_back(std::move(mini));
  }
  return plan;
}

LogprobOptions PolicyUpdate::logprob_options() const {
  return {.temperature = options.sampling.greedy() ? 1.0 : options.sampling.temperature,
          .chunk_size = options.logprob_chunk,
          .autocast = options.autocast};
}

TargetLogprobs micro_batch_logprobs(Qwen2ForCausalLM& policy, const PaddedBatch& padded, const MicroBatch& micro,
                                    const LogprobOptions& options, bool shared_prompt) {
  const torch::Tensor ids = micro.take(padded.input_ids).narrow(1, 0, micro.length);
  const torch::Tensor attention = micro.take(padded.attention_mask).narrow(1, 0, micro.length);
  const torch::Tensor mask = micro.take(padded.loss_mask).narrow(1, 0, micro.length - 1);
  if (!shared_prompt || padded.prompt_lengths.empty()) {
    return response_logprobs(policy, ids, attention, mask, options);
  }
  std::vector<int64_t> prompt_lengths;
  prompt_lengths.reserve(micro.rows.size());
  for (const int64_t row : micro.rows) prompt_lengths.push_back(padded.prompt_lengths[static_cast<std::size_t>(row)]);
  return shared_prompt_response_logprobs(policy, ids, attention, mask, prompt_lengths, options);
}

TargetLogprobs PolicyUpdate::micro_logprobs(Qwen2ForCausalLM& policy, const PaddedBatch& padded,
                                            const MicroBatch& micro, bool with_entropy) const {
  LogprobOptions logprobs = logprob_options();
  logprobs.with_entropy = with_entropy;
  return micro_batch_logprobs(policy, padded, micro, logprobs, options.shared_prompt);
}

// Without grad, on the same micro-batch slices the updates use, for every mini-batch but the first: nothing has
// changed the weights before the first update, so its own forward gives those log-probs (update_mini_batch). The
// forward with and without grad is the same arithmetic (the tests check the log-probs are bitwise equal), so the
// first update's ratio is exactly 1 either way; this saves one forward of every step's batch.
void PolicyUpdate::compute_old_logprobs(TrainBatch& batch, const std::vector<MiniBatch>& plan, bool first_too,
                                        Sums& sums) {
  // linear_logprobs computes in float32 for float32 and half-precision weights, in float64 for float64 ones.
  const bool float64 = model->lm_head_weight().scalar_type() == torch::kFloat64;
  const PaddedBatch& padded = batch.padded;
  batch.old_logp = torch::zeros(padded.loss_mask.sizes(),
                                model->lm_head_weight().options().dtype(float64 ? torch::kFloat64 : torch::kFloat32));
  sums.entropy_by_micro_batch.assign(plan.size(), {});
  torch::NoGradGuard no_grad;
  for (std::size_t m = first_too ? 0 : 1; m < plan.size(); ++m) {
    for (const MicroBatch& micro : plan[m].logprob_micro_batches) {
      const TargetLogprobs out = micro_logprobs(model, padded, micro, /*with_entropy=*/true);
      micro.put(batch.old_logp, out.logp);
      sums.entropy_by_micro_batch[m].push_back(out.entropy_sum);
    }
  }
}

// The reference policy's log-probs of this rank's rows, without grad, for the KL loss.
void PolicyUpdate::compute_ref_logprobs(TrainBatch& batch, const std::vector<MiniBatch>& plan) {
  const PaddedBatch& padded = batch.padded;
  batch.ref_logp = torch::zeros(padded.loss_mask.sizes(), batch.old_logp.scalar_type());
  torch::NoGradGuard no_grad;
  for (const MiniBatch& mini : plan) {
    for (const MicroBatch& micro : mini.logprob_micro_batches) {
      micro.put(batch.ref_logp, micro_logprobs(*reference, padded, micro).logp);
    }
  }
}

// Every rank computed the old log-probs of its own rows (0 elsewhere): their sum is the whole batch's (exact: one
// term of each sum is not 0). Summed where they are, on the device.
void PolicyUpdate::gather_old_logprobs(TrainBatch& batch) const {
  std::vector<torch::Tensor> tensors{batch.old_logp};
  communicator.all_reduce_sum(tensors);
}

// Rollout correction over the whole batch (every rank the same): IS weights into batch.is_weights, rejection into the
// loss mask. Returns verl's rollout_corr/ metrics.
std::map<std::string, double> PolicyUpdate::correct_rollouts(TrainBatch& batch) const {
  if (!batch.rollout_logp.defined()) {
    throw std::invalid_argument(
        "rollout correction: the rollouts carry no log-probs (rollout_is, rollout_rs need them)");
  }
  // Computed on the host (the library's rollout correction is), from one read of the old log-probs.
  const torch::Tensor old_logp = host_door::read(batch.old_logp);
  const torch::Tensor mask = batch.padded.loss_mask.to(torch::kFloat64);
  const torch::Tensor log_ratio = (old_logp.to(torch::kFloat64) - batch.rollout_logp.to(torch::kFloat64)) * mask;
  std::map<std::string, double> metrics;
  if (const auto is = options.extras.rollout_is_options()) {
    dapo::RolloutCorrection out = dapo::rollout_is_weights(log_ratio, mask, *is);
    batch.is_weights = host_door::to_device(out.values.to(old_logp.scalar_type()), batch.old_logp.device());
    metrics.merge(out.metrics);
  }
  if (const auto rs = options.extras.rollout_rs_options(); !rs.empty()) {
    dapo::RolloutCorrection out = dapo::rollout_rejection_mask(log_ratio, mask, rs);
    batch.padded.loss_mask = batch.padded.loss_mask & (out.values > 0.5);
    metrics.merge(out.metrics);
  }
  return metrics;
}

// verl's training/rollout_probs_diff_max|mean|std over the loss tokens, [3] float64 on the device (read with the
// step's entropy); old_logp is the whole batch's. Undefined when the rollouts carry no log-probs.
torch::Tensor PolicyUpdate::rollout_probs_diff(const TrainBatch& batch) const {
  if (!batch.rollout_logp.defined()) return {};
  const auto device = batch.old_logp.device();
  const auto on = torch::TensorOptions().device(device).dtype(torch::kFloat64);
  // The loss tokens' positions, found on the host; the sampler's log-probs there go to the device.
  const torch::Tensor positions = batch.padded.loss_mask.reshape(-1).nonzero().reshape(-1);
  if (positions.numel() == 0) return torch::zeros({3}, on);
  const torch::Tensor rollout = host_door::to_device(batch.rollout_logp.reshape(-1).index_select(0, positions), device);
  const torch::Tensor old = batch.old_logp.reshape(-1).index_select(0, host_door::to_device(positions, device));
  const torch::Tensor diff = (old.to(torch::kFloat64).exp() - rollout.to(torch::kFloat64).exp()).abs();
  return torch::stack({diff.max(), diff.mean(), diff.numel() > 1 ? diff.std() : torch::zeros({}, on)});
}

void release_gradients(const std::vector<torch::Tensor>& parameters) {
  for (const auto& parameter : parameters) {
    if (parameter.grad().defined()) parameter.mutable_grad() = torch::Tensor();
  }
}

// The update's metrics, on the device in float64 until the one read after the optimizer step: the loss, the clipped
// tokens and the KL loss summed over the micro-batches, and each micro-batch's dual-clipped tokens and approximate KL
// (added to the step's sums in order if the update is applied) and its loss's data check (0 when its data passed: on
// CUDA, dapo::policy_loss checks on the device and the host raises after the read).
struct PolicyUpdate::UpdateTotals {
  torch::Tensor loss, clipped, kl_loss;
  std::vector<torch::Tensor> dual_clipped, kl, data_checks;

  // Laid out for the read as `Slot` names them, after the optimizer's norm: kPerMicroBatch is followed by the
  // micro-batches' dual-clipped tokens, then their approximate KL, then their data checks.
  enum Slot : std::ptrdiff_t { kNorm, kLoss, kClipped, kKlLoss, kPerMicroBatch };
  torch::Tensor stacked() const {
    std::vector<torch::Tensor> values{loss, clipped, kl_loss};
    values.insert(values.end(), dual_clipped.begin(), dual_clipped.end());
    values.insert(values.end(), kl.begin(), kl.end());
    values.insert(values.end(), data_checks.begin(), data_checks.end());
    return torch::stack(values);
  }
};

// Each micro-batch's share of the mini-batch's loss (dapo::micro_batch_shares): its options, and where a token-budget
// micro-batch splits a group, each token's weight in the mini-batch's loss.
dapo::MicroBatchShares PolicyUpdate::loss_shares(const TrainBatch& batch, const MiniBatch& mini) const {
  dapo::PolicyLossOptions loss_options = options.loss;
  loss_options.group_size = batch.group_size;
  // Dr. GRPO's constant divisor is the generation budget (TRL: max_completion_length), not a padded width.
  loss_options.norm_length = response_budget(options).norm_length;
  const bool splits_groups = std::any_of(mini.micro_batches.begin(), mini.micro_batches.end(), [&](const auto& micro) {
    return !dapo::holds_whole_groups(micro.rows, batch.group_size);
  });
  dapo::MicroBatchShares shares =
      dapo::micro_batch_shares(loss_options, mini.counts, batch.padded.loss_mask.narrow(0, mini.first_row, mini.rows),
                               splits_groups, batch.old_logp.scalar_type());
  shares.loss.defer_data_checks = true;  // read with the update's metrics (UpdateTotals::data_checks)
  return shares;
}

// One micro-batch's forward, loss (with the KL and entropy terms) and backward; its metrics go to `totals`. With
// `first`, its log-probs are the mini-batch's old ones and its entropy the old policy's.
void PolicyUpdate::accumulate_micro_batch(TrainBatch& batch, const MiniBatch& mini, const MicroBatch& micro,
                                          const dapo::MicroBatchShares& shares, bool first, Sums& sums,
                                          UpdateTotals& totals) {
  RECORD_USER_SCOPE(kMicroBatchScope);
  const bool kl_loss = options.extras.kl_loss_coef > 0.0, entropy_term = options.extras.entropy_coeff != 0.0;
  // The batch's masks, advantages and the aggregation's weights live on the host (the plans read them): the
  // micro-batch's rows go to the device through host_door; the log-probs and IS weights live on the device.
  const auto device = model->lm_head_weight().device();
  const auto to_device = [&](const torch::Tensor& host) { return host_door::to_device(host, device); };
  const auto rows = [&](const torch::Tensor& tensor) { return micro.take(tensor).narrow(1, 0, micro.length - 1); };
  const torch::Tensor host_mask = rows(batch.padded.loss_mask);
  const TargetLogprobs current = micro_logprobs(model, batch.padded, micro, /*with_entropy=*/first || entropy_term);
  const torch::Tensor& logp = current.logp;
  if (first) {
    micro.put(batch.old_logp, logp.detach());
    sums.entropy_by_micro_batch.front().push_back(current.entropy_sum);
  }
  std::vector<int64_t> in_mini = micro.rows;  // its rows of the mini-batch
  for (int64_t& row : in_mini) row -= mini.first_row;
  const dapo::MicroBatchWeights shared =
      dapo::micro_batch_weights(shares, in_mini, host_mask, kl_loss || entropy_term, logp.scalar_type());
  torch::Tensor weights = batch.is_weights.defined() ? rows(batch.is_weights) : torch::Tensor();
  if (shared.loss.defined()) weights = weights.defined() ? weights * to_device(shared.loss) : to_device(shared.loss);
  const auto out = dapo::policy_loss(logp, rows(batch.old_logp), to_device(micro.take(batch.advantages)),
                                     to_device(host_mask), shares.loss, weights);
  const auto as_double = [](const torch::Tensor& value) { return value.detach().to(torch::kFloat64); };
  torch::Tensor total = out.loss;
  if (kl_loss || entropy_term) {
    const torch::Tensor term_weights = to_device(shared.terms);
    if (kl_loss) {
      const dapo::KlPenalty penalty = dapo::parse_kl_penalty(options.extras.kl_loss_type);
      const torch::Tensor kl = (term_weights * dapo::kl_penalty(logp, rows(batch.ref_logp), penalty)).sum();
      totals.kl_loss = totals.kl_loss + as_double(kl);
      total = total + options.extras.kl_loss_coef * kl;
    }
    if (entropy_term) total = total - options.extras.entropy_coeff * (term_weights * current.entropy).sum();
  }
  total.backward();
  const double micro_tokens = host_mask.sum().item<double>();  // the host's mask
  totals.data_checks.push_back(out.data_check.defined() ? out.data_check : torch::zeros_like(totals.loss));
  totals.loss = totals.loss + as_double(out.loss);
  totals.clipped = totals.clipped + as_double(out.clip_fraction) * micro_tokens;
  totals.dual_clipped.push_back(as_double(out.dual_clip_fraction) * micro_tokens);
  totals.kl.push_back(as_double(out.approx_kl) * micro_tokens);
}

// The micro-batches' deferred data checks in the update's read: a loss whose data failed raises the error it would
// have raised at once, named from the micro-batch's host mask.
void PolicyUpdate::raise_deferred_checks(const torch::Tensor& read, const TrainBatch& batch, const MiniBatch& mini,
                                         const dapo::PolicyLossOptions& share) {
  const auto micro_batches = static_cast<std::ptrdiff_t>(mini.micro_batches.size());
  const double* checks = read.data_ptr<double>() + UpdateTotals::kPerMicroBatch + 2 * micro_batches;
  for (std::ptrdiff_t i = 0; i < micro_batches; ++i) {
    const MicroBatch& micro = mini.micro_batches[static_cast<std::size_t>(i)];
    if (checks[i] == 0.0) continue;
    dapo::check_deferred_policy_loss(checks[i], micro.take(batch.padded.loss_mask).narrow(1, 0, micro.length - 1),
                                     share);
  }
}

// The update's read (the norm, then UpdateTotals::stacked()) into the step's sums; a non-finite norm skipped the
// update: its loss and clip counts stay out of the step's metrics, and the clock advances all the same.
void PolicyUpdate::settle_update(const torch::Tensor& read, const MiniBatch& mini, double lr, Sums& sums) {
  using Slot = UpdateTotals::Slot;
  const auto at = [&](std::ptrdiff_t slot) { return read.data_ptr<double>()[slot]; };
  const auto micro_batches = static_cast<std::ptrdiff_t>(mini.micro_batches.size());
  const double grad_norm = at(Slot::kNorm);
  sums.lr = lr;
  sums.tokens_by_update.push_back(mini.counts.tokens);
  if (!std::isfinite(grad_norm)) {
    sums.clipped_by_update.push_back(0.0);
    ++sums.skipped;
    return;
  }
  sums.loss += at(Slot::kLoss);
  sums.kl_loss += at(Slot::kKlLoss);
  sums.grad_norm += grad_norm;
  for (std::ptrdiff_t i = 0; i < micro_batches; ++i) sums.dual_clipped += at(Slot::kPerMicroBatch + i);
  for (std::ptrdiff_t i = 0; i < micro_batches; ++i) sums.kl += at(Slot::kPerMicroBatch + micro_batches + i);
  sums.clipped_by_update.push_back(at(Slot::kClipped));
}

// One optimizer update: this rank's micro-batches accumulate their shares, the ranks sum, clip, step. The step's
// first update (`first`) also records its forward's log-probs as the mini-batch's old ones, and their entropy.
void PolicyUpdate::update_mini_batch(TrainBatch& batch, const MiniBatch& mini, double lr, bool first, Sums& sums,
                                     WeightCastScope& casts) {
  const dapo::MicroBatchShares shares = loss_shares(batch, mini);
  release_gradients(model->parameters());  // none left by the last update; any a caller left start nothing
  const torch::Tensor zero = torch::zeros({}, model->lm_head_weight().options().dtype(torch::kFloat64));
  UpdateTotals totals{zero, zero, zero, {}, {}, {}};
  for (const MicroBatch& micro : mini.micro_batches) {
    accumulate_micro_batch(batch, mini, micro, shares, first, sums, totals);
  }
  casts.clear();  // this optimizer step's weight casts: the step changes the weights they were made from
  RECORD_USER_SCOPE(kOptimizerStepScope);
  communicator.all_reduce_gradients(model->parameters());  // the sum of the ranks' shares: the mini-batch's gradient
  for (auto& group : optimizer.param_groups()) static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
  // A NaN or infinity anywhere in the summed gradient (every rank sees the same norm) skips the update, as verl's
  // actor does, so that neither the weights nor AdamW's moments take it in (train/optimizer.hpp). The update's one
  // read: the norm (whether the step applied) and the metrics.
  const torch::Tensor read = optimizer.step_and_read(options.grad_clip, totals.stacked());
  release_gradients(model->parameters());
  raise_deferred_checks(read, batch, mini, shares.loss);
  settle_update(read, mini, lr, sums);
}

std::optional<std::array<double, 3>> PolicyUpdate::read_after_updates(Sums& sums,
                                                                      const torch::Tensor& probs_diff) const {
  std::vector<torch::Tensor> values;
  for (const auto& mini : sums.entropy_by_micro_batch) {
    for (const torch::Tensor& entropy : mini) values.push_back(entropy.to(torch::kFloat64).reshape(1));
  }
  if (probs_diff.defined()) values.push_back(probs_diff);
  if (values.empty()) return std::nullopt;
  const torch::Tensor read = host_door::read(torch::cat(values));
  const double* value = read.data_ptr<double>();
  for (const auto& mini : sums.entropy_by_micro_batch) {
    for (std::size_t i = 0; i < mini.size(); ++i) sums.entropy += *value++;
  }
  if (!probs_diff.defined()) return std::nullopt;
  return std::array<double, 3>{value[0], value[1], value[2]};
}

UpdateMetrics PolicyUpdate::reduce(const TrainBatch& batch, Sums& sums) const {
  std::vector<double> totals{sums.dual_clipped, sums.kl, sums.loss, sums.entropy, sums.kl_loss};
  constexpr std::ptrdiff_t kFixed = 5;
  totals.insert(totals.end(), sums.clipped_by_update.begin(), sums.clipped_by_update.end());
  totals = communicator.all_reduce_sum(totals);
  std::copy(totals.begin() + kFixed, totals.end(), sums.clipped_by_update.begin());
  const double clipped = std::accumulate(sums.clipped_by_update.begin(), sums.clipped_by_update.end(), 0.0);
  const double total_tokens = batch.padded.loss_mask.sum().item<double>();
  const auto updates = static_cast<double>(sums.clipped_by_update.size());
  const double counted = std::max(total_tokens * static_cast<double>(options.ppo_epochs), 1.0);
  UpdateMetrics metrics;
  // Loss and gradient norm: means over the updates that were applied.
  const auto applied = std::max(updates - static_cast<double>(sums.skipped), 1.0);
  metrics.loss = totals[2] / applied;
  metrics.clip_fraction = clipped / counted;
  metrics.dual_clip_fraction = totals[0] / counted;
  metrics.approx_kl = totals[1] / counted;
  for (std::size_t i = 0; i < sums.clipped_by_update.size(); ++i) {
    const double tokens = sums.tokens_by_update[i];
    metrics.clip_fraction_by_update.push_back(tokens > 0 ? sums.clipped_by_update[i] / tokens : 0.0);
  }
  metrics.entropy = sums.entropy_tokens > 0 ? totals[3] / sums.entropy_tokens : 0.0;
  if (options.extras.kl_loss_coef > 0.0) metrics.kl_loss = totals[4] / applied;
  metrics.grad_norm = sums.grad_norm / applied;
  metrics.skipped_updates = sums.skipped;
  metrics.lr = sums.lr;
  return metrics;
}

UpdateMetrics PolicyUpdate::run(TrainBatch& batch, int64_t& updates) {
  const auto started = std::chrono::steady_clock::now();
  const host_door::Counts door = host_door::counts();
  const MicroBatching cut = MicroBatching::from(options);
  const auto [own_begin, own_end] = communicator.shard(cut.mini_groups);
  const std::vector<MiniBatch> plan = plan_mini_batches(batch, cut, own_begin, own_end);

  torch::AutoGradMode enable_grad(true);  // whatever the caller's mode: the updates need gradients
  model->train();
  // Under autocast, each float32 weight is cast once per optimizer step: the no-grad passes before the first update
  // and every micro-batch of an update (forward and checkpointed recomputes) read the same cast (WeightCastScope).
  WeightCastScope casts;
  Sums sums;
  sums.entropy_tokens = batch.padded.loss_mask.sum().item<double>();
  const bool correct = options.extras.rollout_correction();
  compute_old_logprobs(batch, plan, /*first_too=*/correct, sums);
  if (options.extras.kl_loss_coef > 0.0) {
    if (reference == nullptr) throw std::logic_error("policy update: kl_loss_coef > 0 needs a reference model");
    compute_ref_logprobs(batch, plan);
  }
  torch::Tensor probs_diff;  // [3] on the device, read after the updates
  std::map<std::string, double> correction;
  std::vector<MiniBatch> corrected_plan;
  if (correct) {
    gather_old_logprobs(batch);
    probs_diff = rollout_probs_diff(batch);  // over the response tokens, before rejection
    correction = correct_rollouts(batch);
    // The rejection changed the loss mask: count the mini-batches again (the slices stay).
    corrected_plan = plan_mini_batches(batch, cut, own_begin, own_end);
  }
  const std::vector<MiniBatch>& updates_plan = correct ? corrected_plan : plan;
  const LrSchedule schedule = options.lr_schedule();
  for (int64_t epoch = 0; epoch < options.ppo_epochs; ++epoch) {
    for (std::size_t m = 0; m < updates_plan.size(); ++m) {
      update_mini_batch(batch, updates_plan[m], learning_rate(schedule, updates++), !correct && epoch == 0 && m == 0,
                        sums, casts);
    }
  }
  if (!correct) {
    gather_old_logprobs(batch);
    probs_diff = rollout_probs_diff(batch);
  }
  // The step's one read after its updates (each update reads once): the entropy and the probabilities' gap.
  const std::optional<std::array<double, 3>> probs_diff_values = read_after_updates(sums, probs_diff);
  UpdateMetrics metrics = reduce(batch, sums);
  metrics.rollout_probs_diff = probs_diff_values;
  metrics.rollout_correction = std::move(correction);
  metrics.host_reads = host_door::counts().reads - door.reads;
  metrics.host_copies = host_door::counts().copies - door.copies;
  metrics.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  metrics.tokens_per_second = batch.padded.attention_mask.sum().item<double>() *
                              static_cast<double>(options.ppo_epochs + 1) / std::max(metrics.seconds, 1e-9);
  return metrics;
}

}  // namespace qwen
