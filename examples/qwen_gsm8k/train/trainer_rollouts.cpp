// The step's rollouts: generation rounds over the training problems, dynamic sampling (DAPO Eq. 11) on accuracy, and
// the metrics of everything sampled. With several ranks each round is sharded and all-gathered.
#include <dapo/core/sampling.hpp>

#include <algorithm>
#include <cmath>

#include "qwen_gsm8k/common/seed.hpp"
#include "qwen_gsm8k/model/autocast.hpp"
#include "qwen_gsm8k/train/step_metrics.hpp"
#include "qwen_gsm8k/train/trainer.hpp"

namespace qwen {

std::vector<Group> Trainer::collect_groups(nlohmann::json& metrics) {
  const int64_t target = options_.train_batch_size;
  const int64_t per_round = options_.gen_batch_size > 0 ? options_.gen_batch_size : target;
  RolloutStats stats;
  SampledResponses sampled;
  auto next_groups = [&](int64_t round, int64_t count) {
    std::vector<Problem> problems;
    for (const auto index : sampler_.next(static_cast<std::size_t>(count))) problems.push_back(train_[index]);
    const auto rank = static_cast<uint64_t>(communicator_->rank());
    return round_groups(problems, derived_seed(options_.seed, step_, round, 1 + 16 * rank), stats);
  };
  torch::NoGradGuard no_grad;
  model_->eval();
  std::vector<Group> batch;
  if (options_.dynamic_sampling) {
    // DAPO Eq. 11: draw rounds until train_batch_size groups disagree on accuracy; the surplus is dropped.
    dapo::core::DynamicSampler<Group> sampler(
        {.target_groups = target, .group_size = options_.rollout_n, .max_rounds = options_.max_num_gen_batches});
    for (int64_t round = 0; !sampler.ready(); ++round) {
      std::vector<Group> groups = next_groups(round, per_round);
      const std::vector<double> accuracy = sampled.add(groups);
      sampler.add_round(std::move(groups), accuracy);
    }
    batch = sampler.take();
    metrics["train/num_gen_batches"] = sampler.last_rounds();
    metrics["dapo/filtered_groups"] = sampler.last_filtered();
    metrics["dapo/surplus_groups"] = sampler.last_surplus();
  } else {
    batch = next_groups(0, target);  // GRPO: one round, every group kept
    sampled.add(batch);
    metrics["train/num_gen_batches"] = 1;
    metrics["dapo/filtered_groups"] = 0;
    metrics["dapo/surplus_groups"] = 0;
  }
  sampled.write(metrics);
  metrics["dapo/kept_groups"] = static_cast<int64_t>(batch.size());
  // Tokens of all ranks over this rank's generation time (the ranks wait for each other after every round).
  const double generated = communicator_->all_reduce_sum({static_cast<double>(stats.generated_tokens)})[0];
  metrics["perf/rollout_tokens_per_second"] = generated / std::max(stats.seconds, 1e-9);
  metrics["timing_s/gen"] = stats.seconds;
  return batch;
}

std::vector<Group> Trainer::round_groups(const std::vector<Problem>& problems, uint64_t seed, RolloutStats& stats) {
  const auto [begin, end] = communicator_->shard(static_cast<int64_t>(problems.size()));
  const std::vector<Problem> mine(problems.begin() + begin, problems.begin() + end);
  std::vector<Group> own;
  if (options_.fixed_rollouts) {
    own = options_.fixed_rollouts(mine);
  } else if (!mine.empty()) {
    const AutocastGuard autocast(model_->lm_head_weight().device(), options_.autocast);
    own = rollout(model_, tokenizer_, mine, rollout_options_, seed, &stats);
  }
  if (world_size() == 1) return own;
  std::vector<double> packed = encode_groups(own);
  const std::vector<double> lengths = communicator_->all_gather({static_cast<double>(packed.size())});
  const auto longest = static_cast<std::size_t>(*std::max_element(lengths.begin(), lengths.end()));
  packed.resize(longest, 0.0);
  const std::vector<double> all = communicator_->all_gather(packed);
  std::vector<Group> groups;
  for (std::size_t rank = 0; rank < lengths.size(); ++rank) {
    for (auto& group : decode_groups(all.data() + rank * longest, static_cast<std::size_t>(lengths[rank]))) {
      groups.push_back(std::move(group));
    }
  }
  return groups;
}

}  // namespace qwen
