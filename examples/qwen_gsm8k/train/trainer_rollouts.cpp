// The step's rollouts: generation rounds over the training problems, dynamic sampling (DAPO Eq. 11) on accuracy, and
// the metrics of everything sampled. With several ranks each round is sharded and all-gathered.
#include <dapo/core/sampling.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "qwen_gsm8k/common/seed.hpp"
#include "qwen_gsm8k/engine/group_stream.hpp"
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
  if (options_.dynamic_sampling && world_size() == 1 && !options_.fixed_rollouts) {
    batch = stream_groups(per_round, stats, sampled, metrics);
  } else if (options_.dynamic_sampling) {
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
    metrics["dapo/dropped_groups"] = 0;
  } else {
    batch = next_groups(0, target);  // GRPO: one round, every group kept
    sampled.add(batch);
    metrics["train/num_gen_batches"] = 1;
    metrics["dapo/filtered_groups"] = 0;
    metrics["dapo/surplus_groups"] = 0;
    metrics["dapo/dropped_groups"] = 0;
  }
  sampled.write(metrics);
  metrics["dapo/kept_groups"] = static_cast<int64_t>(batch.size());
  // Tokens of all ranks over this rank's generation time (the ranks wait for each other after every round).
  const double generated = communicator_->all_reduce_sum({static_cast<double>(stats.generated_tokens)})[0];
  metrics["perf/rollout_tokens_per_second"] = generated / std::max(stats.seconds, 1e-9);
  metrics["timing_s/gen"] = stats.seconds;
  metrics["perf/decode_calls"] = stats.decode_calls;
  // Admissions (prefill calls), reads of the finished flags, and CUDA-graph captures and replays of the decode steps:
  // what the GPU check reads to see where a rollout's host waits and captures go.
  metrics["perf/prefill_calls"] = stats.prefill_calls;
  metrics["perf/engine_checks"] = stats.checks;
  metrics["perf/graph_captures"] = stats.graph_captures;
  metrics["perf/graph_replays"] = stats.graph_replays;
  // The rollout's reads of device data by the host (waits, and fetches taken a step later) and copies to the device
  // (model/host_door.hpp).
  metrics["perf/host_reads"] = stats.host_reads;
  metrics["perf/host_fetches"] = stats.host_fetches;
  metrics["perf/host_copies"] = stats.host_copies;
  // Rows of the decode steps plus each sequence's first token (from its prompt's prefill), per generated token: 1
  // when no row is computed in vain; the check interval and static batches add to it.
  metrics["perf/rows_per_generated_token"] = static_cast<double>(stats.rows_computed + stats.sequences) /
                                             std::max(1.0, static_cast<double>(stats.generated_tokens));
  return batch;
}

// Streaming dynamic sampling (one rank), scheduled by GroupStream: the engine takes prompts as slots free up and
// admission allows, at most max_num_gen_batches x gen_batch_size of them; complete groups are decided in prompt order;
// the engine stops when train_batch_size informative groups are decided, dropping the later groups (finished or in
// flight).
std::vector<Group> Trainer::stream_groups(int64_t per_round, RolloutStats& stats, SampledResponses& sampled,
                                          nlohmann::json& metrics) {
  const int64_t target = options_.train_batch_size;
  const int64_t limit = std::max<int64_t>(options_.max_num_gen_batches, 0) * per_round;
  const uint64_t seed = derived_seed(options_.seed, step_, 0, 1);
  GroupStream stream(options_.rollout_n, target, limit);
  // max_rounds 0: the bound is the stream's.
  dapo::core::DynamicSampler<Group> sampler(
      {.target_groups = target, .group_size = options_.rollout_n, .max_rounds = 0});
  std::vector<Group> groups;                    // by request index
  std::vector<std::vector<double>> accuracies;  // of each complete group
  const AutocastGuard autocast(model_->lm_head_weight().device(), options_.autocast);
  const auto started = std::chrono::steady_clock::now();
  const EngineStats counts = rollout_engine().run(
      [&]() -> std::optional<EngineRequest> {
        if (!stream.admit()) return std::nullopt;
        Group group;
        group.problem = train_[sampler_.next(1).front()];
        group.prompt = prompt_ids(tokenizer_, rollout_options_.system_prompt, group.problem.question);
        group.responses.resize(static_cast<std::size_t>(options_.rollout_n));
        groups.push_back(std::move(group));
        accuracies.emplace_back();
        const int64_t index = stream.pulled() - 1;
        return EngineRequest{
            .prompt = groups.back().prompt, .n = options_.rollout_n, .seed = request_seed(seed, index)};
      },
      [&](EngineSequence&& sequence) {
        const auto index = static_cast<std::size_t>(sequence.request);
        Group& group = groups[index];
        const auto sample = static_cast<std::size_t>(sequence.sample);
        group.responses[sample] =
            make_response(tokenizer_, std::move(sequence), group.problem.reference, rollout_options_.rewards);
        if (!stream.response_done(sequence.request)) return true;
        accuracies[index] = sampled.add({group});
        return stream.decide([&](int64_t next) {
          const int64_t before = sampler.kept();
          std::vector<Group> one;  // moved in: a braced list would copy the group
          one.push_back(std::move(groups[static_cast<std::size_t>(next)]));
          sampler.add_round(std::move(one), accuracies[static_cast<std::size_t>(next)]);
          return sampler.kept() > before;
        });
      });
  stats.add(counts);
  stats.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  const int64_t pulled = stream.pulled(), rounds = (pulled + per_round - 1) / per_round;
  if (!sampler.ready()) {
    throw std::runtime_error(
        "dynamic sampling: " + std::to_string(pulled) + " prompts (" + std::to_string(rounds) +
        " generation rounds, max_num_gen_batches = " + std::to_string(options_.max_num_gen_batches) + ") kept " +
        std::to_string(sampler.kept()) + " informative groups of the " + std::to_string(target) +
        " wanted; the prompts are too easy or too hard for the policy. Lower the problems' difficulty, raise the "
        "number of responses per prompt, or raise max_num_gen_batches (0 = unlimited)");
  }
  std::vector<Group> batch = sampler.take();
  metrics["train/num_gen_batches"] = rounds;
  metrics["dapo/filtered_groups"] = sampler.last_filtered();
  metrics["dapo/surplus_groups"] = sampler.last_surplus();
  metrics["dapo/dropped_groups"] = stream.dropped();
  return batch;
}

GenerationEngine& Trainer::rollout_engine() {
  if (!rollout_engine_) {
    const int64_t per_round = options_.gen_batch_size > 0 ? options_.gen_batch_size : options_.train_batch_size;
    const int64_t rows = (per_round + world_size() - 1) / world_size() * options_.rollout_n;  // this rank's share
    // Its slots hold the longest training prompt and the longest evaluated one (evaluations run through it too).
    const auto evaluated =
        std::min<std::size_t>(static_cast<std::size_t>(std::max<int64_t>(options_.eval_problems, 0)), test_.size());
    const int64_t longest =
        std::max(max_train_prompt_tokens(),
                 longest_prompt_tokens(
                     tokenizer_, rollout_options_.system_prompt,
                     std::vector<Problem>(test_.begin(), test_.begin() + static_cast<std::ptrdiff_t>(evaluated))));
    rollout_engine_ =
        std::make_unique<GenerationEngine>(model_, rollout_engine_options(rollout_options_, rows, longest));
  }
  return *rollout_engine_;
}

int64_t Trainer::max_train_prompt_tokens() {
  if (max_train_prompt_tokens_ == 0) {
    max_train_prompt_tokens_ = longest_prompt_tokens(tokenizer_, rollout_options_.system_prompt, train_);
  }
  return max_train_prompt_tokens_;
}

std::vector<Group> Trainer::round_groups(const std::vector<Problem>& problems, uint64_t seed, RolloutStats& stats) {
  const auto [begin, end] = communicator_->shard(static_cast<int64_t>(problems.size()));
  const std::vector<Problem> mine(problems.begin() + begin, problems.begin() + end);
  std::vector<Group> own;
  if (options_.fixed_rollouts) {
    own = options_.fixed_rollouts(mine);
  } else if (!mine.empty()) {
    const AutocastGuard autocast(model_->lm_head_weight().device(), options_.autocast);
    own = rollout(rollout_engine(), tokenizer_, mine, rollout_options_, seed, &stats);
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
