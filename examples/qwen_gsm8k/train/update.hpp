// The policy update of one DAPO step, as verl's actor runs it: old log-probs from the training forward (no grad), then
// ppo_epochs passes over the mini-batches of whole groups, one AdamW update each, so that every update after the first
// is off-policy and the decoupled clip acts. The first mini-batch's old log-probs come from its first update's forward
// (as TRL takes them when the update is on-policy): the same numbers, one forward fewer. A mini-batch's gradient
// accumulates over micro-batches, each loss its exact share of the mini-batch's loss (dapo::micro_batch_options);
// data-parallel ranks each take a contiguous share of every mini-batch's groups and sum their gradients, which gives
// the single-process gradient.
//
// Beside the policy loss, each update may add a KL loss against a frozen reference policy and an entropy term, both
// aggregated as the policy loss is (dapo::aggregation_weights). With rollout correction on, every mini-batch's old
// log-probs are computed before the first update (as verl does: the IS weights and the rejection mask are functions of
// the whole batch's), rejection narrows the loss mask, and the weights go to the loss as its per-token weights.
//
// Shapes: B = rows of the step's batch (groups * group_size), L = its longest row; see batch.hpp.
#pragma once

#include <dapo/aggregation.hpp>
#include <dapo/loss.hpp>

#include <torch/torch.h>

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "qwen_gsm8k/dist/distributed.hpp"
#include "qwen_gsm8k/model/model.hpp"
#include "qwen_gsm8k/train/batch.hpp"
#include "qwen_gsm8k/train/optimizer.hpp"
#include "qwen_gsm8k/train/train_options.hpp"

namespace qwen {

// The update's profiler scopes (RECORD_USER_SCOPE; free unless LibTorch's profiler is on): one micro-batch's forward,
// loss and backward; one optimizer step (all-reduce, clipping, AdamW). benchmarks/profile_bench attributes the
// device's kernels to them.
inline constexpr const char* kMicroBatchScope = "dapo::update_micro_batch";
inline constexpr const char* kOptimizerStepScope = "dapo::optimizer_step";

// Some rows of the batch, in ascending order; columns [0, length) hold every real token of those rows. Whole-group
// micro-batches are consecutive rows; token-budget ones (use_dynamic_bsz) any rows of one rank's share.
struct MicroBatch {
  std::vector<int64_t> rows;
  int64_t length = 0;

  // The rows of `tensor` [B, ...]: a view when they are consecutive, a copy otherwise.
  torch::Tensor take(const torch::Tensor& tensor) const;
  // Writes `values` [rows, n] into columns [0, n) of the rows of `into` [B, >= n].
  void put(const torch::Tensor& into, const torch::Tensor& values) const;
  // prompt + response tokens as the forward pays for them: rows x the longest row.
  int64_t padded_tokens() const { return static_cast<int64_t>(rows.size()) * length; }
};

struct MiniBatch {
  int64_t first_row = 0, rows = 0;
  dapo::MiniBatchCounts counts;           // of the whole mini-batch's loss mask: what every share divides by
  std::vector<MicroBatch> micro_batches;  // this rank's share of the mini-batch, cut into the update's micro-batches
  // The same share cut for the no-grad passes (old and reference log-probs); the update's cut without a token budget.
  std::vector<MicroBatch> logprob_micro_batches;
};

// How a mini-batch's share is cut into micro-batches: whole groups (micro_groups at a time), or, with a token budget
// (verl's use_dynamic_bsz), rows packed longest first so that no micro-batch's rows x longest row exceeds it.
struct MicroBatching {
  int64_t mini_groups = 1;         // groups per mini-batch (one optimizer update)
  int64_t micro_groups = 1;        // groups per micro-batch, without a budget
  int64_t max_tokens = 0;          // the update's budget of padded tokens per micro-batch; 0: whole groups
  int64_t logprob_max_tokens = 0;  // the no-grad passes' budget; 0: the update's cut

  static MicroBatching from(const TrainOptions& options);
};

// The mini-batches of the batch; this rank owns groups [own_begin, own_end) of each. Throws std::invalid_argument
// naming the row when a row is longer than a token budget.
std::vector<MiniBatch> plan_mini_batches(const TrainBatch& batch, const MicroBatching& cut, int64_t own_begin,
                                         int64_t own_end);

// Rows packed into micro-batches of at most max_tokens padded tokens (rows x the longest row): longest first, each
// micro-batch takes the next rows while they fit. `lengths` are the rows' prompt + response tokens; `where` names the
// budget in the error a row longer than it gets.
std::vector<std::vector<int64_t>> pack_rows_by_tokens(const std::vector<int64_t>& row_ids,
                                                      const std::vector<int64_t>& lengths, int64_t max_tokens,
                                                      const char* where);

// A micro-batch's log-probs [rows, length - 1] under `policy`, 0 outside its loss mask (entropy likewise), as every
// pass of the update computes them: with the shared-prompt forward (each distinct prompt among its rows once,
// TrainOptions::shared_prompt) when `shared_prompt` and the batch has its rows' prompt lengths, else each row whole.
// The batch stays on the host; the micro-batch's rows go to the policy's device through host_door.
TargetLogprobs micro_batch_logprobs(Qwen2ForCausalLM& policy, const PaddedBatch& padded, const MicroBatch& micro,
                                    const LogprobOptions& options, bool shared_prompt);

// Gradients set to none (PyTorch's zero_grad(set_to_none=True); LibTorch 1.13's zero_grad only zeroes them): their
// memory, as much as the weights', goes back, so rollouts and the no-grad passes never hold it; the next backward
// allocates them afresh. The update does this before and after every optimizer step.
void release_gradients(const std::vector<torch::Tensor>& parameters);

// The step's update, summed over the ranks.
struct UpdateMetrics {
  double loss = 0.0;  // mean over applied updates of the mini-batch loss
  double clip_fraction = 0.0, dual_clip_fraction = 0.0, approx_kl = 0.0;  // over all updates' tokens
  std::vector<double> clip_fraction_by_update;                            // one per optimizer update, in order
  double entropy = 0.0;                           // mean over the batch's loss tokens, under the old policy
  double grad_norm = 0.0;                         // mean over applied updates, before clipping
  int64_t skipped_updates = 0;                    // updates skipped for a non-finite gradient norm (weights untouched)
  double lr = 0.0;                                // of the last update
  double seconds = 0.0, tokens_per_second = 0.0;  // the batch's tokens x (ppo_epochs + 1) passes, per second
  // This process's reads of device data (on a GPU each a wait for the device: one per optimizer update and one after
  // them) and copies to the device, through host_door.
  int64_t host_reads = 0, host_copies = 0;
  // |exp(old_logp) - exp(rollout_logp)| over the loss tokens, the trainer's probabilities against the sampler's (verl's
  // training/rollout_probs_diff_*): max, mean, std; absent when the rollouts carry no log-probs.
  std::optional<std::array<double, 3>> rollout_probs_diff;
  std::map<std::string, double> rollout_correction;  // verl's rollout_corr/* metrics, when rollout correction is on
  std::optional<double> kl_loss;  // with a KL loss: mean over applied updates of the aggregated KL penalty
};

class WeightCastScope;  // model/autocast.hpp

struct PolicyUpdate {
  Qwen2ForCausalLM& model;
  ClippedAdamW& optimizer;
  Communicator& communicator;
  const TrainOptions& options;
  Qwen2ForCausalLM* reference = nullptr;  // the frozen reference policy of a KL loss (options.kl_loss_coef > 0)

  // Fills batch.old_logp, then runs every update; `updates` counts the run's optimizer updates (the schedule's clock).
  UpdateMetrics run(TrainBatch& batch, int64_t& updates);

 private:
  struct Sums;
  struct UpdateTotals;
  LogprobOptions logprob_options() const;
  TargetLogprobs micro_logprobs(Qwen2ForCausalLM& policy, const PaddedBatch& padded, const MicroBatch& micro,
                                bool with_entropy = false) const;
  void compute_old_logprobs(TrainBatch& batch, const std::vector<MiniBatch>& plan, bool first_too, Sums& sums);
  void compute_ref_logprobs(TrainBatch& batch, const std::vector<MiniBatch>& plan);
  void gather_old_logprobs(TrainBatch& batch) const;
  std::map<std::string, double> correct_rollouts(TrainBatch& batch) const;
  torch::Tensor rollout_probs_diff(const TrainBatch& batch) const;
  std::optional<std::array<double, 3>> read_after_updates(Sums& sums, const torch::Tensor& probs_diff) const;
  dapo::MicroBatchShares loss_shares(const TrainBatch& batch, const MiniBatch& mini) const;
  void accumulate_micro_batch(TrainBatch& batch, const MiniBatch& mini, const MicroBatch& micro,
                              const dapo::MicroBatchShares& shares, bool first, Sums& sums, UpdateTotals& totals);
  static void raise_deferred_checks(const torch::Tensor& read, const TrainBatch& batch, const MiniBatch& mini,
                                    const dapo::PolicyLossOptions& share);
  static void settle_update(const torch::Tensor& read, const MiniBatch& mini, double lr, Sums& sums);
  void update_mini_batch(TrainBatch& batch, const MiniBatch& mini, double lr, bool first, Sums& sums,
                         WeightCastScope& casts);
  UpdateMetrics reduce(const TrainBatch& batch, Sums& sums) const;
};

}  // namespace qwen
