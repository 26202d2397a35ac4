// Dynamic sampling (DAPO Section 3.2, the constraint in Eq. 11) on plain buffers: which groups carry a gradient, and a
// collector that keeps drawing generation rounds until enough such groups are in hand. No LibTorch here.
//
// Shapes: N = num_groups * group_size scores; the G = group_size responses of one prompt are consecutive.
//
// Filter on accuracy (0/1 correctness), not on the shaped reward: overlong and format terms differ between the
// responses of a group even when all of them are right (or all wrong), so a shaped-reward filter would keep groups
// whose whole "signal" is length or formatting noise. The paper filters on accuracy; so does verl's
// `filter_groups.metric=acc`.
#pragma once

#include <concepts>
#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <utility>
#include <vector>

#include "dapo/core/advantage.hpp"
#include "dapo/core/error.hpp"

namespace dapo {

struct DynamicSamplingOptions {
  int64_t target_groups = 0;  // informative groups wanted per step (verl: data.train_batch_size, in prompts)
  int64_t group_size = 0;     // responses per prompt (verl: actor_rollout_ref.rollout.n)
  int64_t max_rounds = 0;     // generation rounds allowed per step (verl: max_num_gen_batches); 0 = unlimited
};

namespace core {

// scores [N] -> informative [N / group_size]: true where the group's scores are not all equal.
template <std::floating_point T>
void informative_groups(std::span<const T> scores, int64_t group_size, std::span<bool> informative) {
  constexpr const char* kWhere = "dapo::core::informative_groups";
  const auto count = static_cast<int64_t>(scores.size());
  detail::check_group_size(count, group_size, kWhere, "scores");
  DAPO_REQUIRE(static_cast<int64_t>(informative.size()) == count / group_size, kWhere, "informative has ",
               informative.size(), " elements, expected one per group (", count / group_size, ")");
  detail::check_finite(scores, kWhere, "scores");
  for (int64_t group = 0; group < count / group_size; ++group) {
    const T* first = scores.data() + group * group_size;
    bool varied = false;
    for (int64_t i = 1; i < group_size && !varied; ++i) varied = first[i] != first[0];
    informative[group] = varied;
  }
}

// What one call to DynamicSampler::add_round saw.
struct RoundStats {
  int64_t round = 0;     // 1-based index of this round within the current step
  int64_t offered = 0;   // groups in the round
  int64_t kept = 0;      // informative groups added to the batch
  int64_t filtered = 0;  // groups dropped because all their accuracies were equal
};

// Collects informative groups over generation rounds until `target_groups` are held (verl's DAPO trainer loop).
// Surplus policy: take() returns exactly target_groups groups in arrival order and drops the rest, as verl does.
// Keeping the surplus for the next step would train on rollouts of an older policy without saying so.
template <class Group>
class DynamicSampler {
 public:
  explicit DynamicSampler(const DynamicSamplingOptions& options) : options_(options) {
    constexpr const char* kWhere = "dapo::DynamicSampler";
    DAPO_REQUIRE(options.target_groups >= 1, kWhere, "target_groups is ", options.target_groups, ", expected >= 1");
    DAPO_REQUIRE(options.group_size >= 2, kWhere, "group_size is ", options.group_size, ", expected >= 2");
    DAPO_REQUIRE(options.max_rounds >= 0, kWhere, "max_rounds is ", options.max_rounds,
                 ", expected >= 0 (0 = unlimited)");
  }

  // groups: one payload per prompt; accuracy [groups.size() * group_size], the 0/1 correctness of each response.
  // Throws std::runtime_error when this round used up max_rounds without reaching target_groups.
  RoundStats add_round(std::vector<Group> groups, std::span<const double> accuracy) {
    constexpr const char* kWhere = "dapo::DynamicSampler::add_round";
    DAPO_REQUIRE(static_cast<int64_t>(accuracy.size()) == static_cast<int64_t>(groups.size()) * options_.group_size,
                 kWhere, "accuracy has ", accuracy.size(),
                 " elements, expected groups.size() * group_size = ", groups.size(), " * ", options_.group_size);
    const auto keep = std::make_unique<bool[]>(groups.size());
    if (!groups.empty()) informative_groups(accuracy, options_.group_size, std::span<bool>(keep.get(), groups.size()));
    RoundStats stats{++rounds_, static_cast<int64_t>(groups.size()), 0, 0};
    for (std::size_t i = 0; i < groups.size(); ++i) {
      if (keep[i]) {
        kept_.push_back(std::move(groups[i]));
        ++stats.kept;
      } else {
        ++stats.filtered;
      }
    }
    filtered_ += stats.filtered;
    if (!ready() && options_.max_rounds > 0 && rounds_ >= options_.max_rounds) {
      throw std::runtime_error(detail::concat(
          "dapo::DynamicSampler: ", rounds_, " generation rounds (max_rounds = ", options_.max_rounds, ") kept ",
          kept_.size(), " informative groups of the ", options_.target_groups,
          " wanted; the prompts are too easy or too hard for the policy. Lower the problems' difficulty, raise the "
          "number of responses per prompt, or raise max_rounds (0 = unlimited)"));
    }
    return stats;
  }

  bool ready() const { return static_cast<int64_t>(kept_.size()) >= options_.target_groups; }

  // The first target_groups informative groups; resets the sampler for the next step. Requires ready().
  std::vector<Group> take() {
    DAPO_REQUIRE(ready(), "dapo::DynamicSampler::take", "only ", kept_.size(), " of ", options_.target_groups,
                 " groups collected; call add_round until ready()");
    surplus_ = static_cast<int64_t>(kept_.size()) - options_.target_groups;
    kept_.resize(static_cast<std::size_t>(options_.target_groups));
    std::vector<Group> batch = std::move(kept_);
    kept_.clear();
    last_rounds_ = std::exchange(rounds_, 0);
    last_filtered_ = std::exchange(filtered_, 0);
    return batch;
  }

  int64_t rounds() const { return rounds_; }  // rounds drawn so far in the current step
  int64_t kept() const { return static_cast<int64_t>(kept_.size()); }
  int64_t filtered() const { return filtered_; }
  // Counters of the step most recently closed by take().
  int64_t last_rounds() const { return last_rounds_; }
  int64_t last_filtered() const { return last_filtered_; }
  int64_t last_surplus() const { return surplus_; }
  const DynamicSamplingOptions& options() const { return options_; }

 private:
  DynamicSamplingOptions options_;
  std::vector<Group> kept_;
  int64_t rounds_ = 0, filtered_ = 0;
  int64_t last_rounds_ = 0, last_filtered_ = 0, surplus_ = 0;
};

}  // namespace core
}  // namespace dapo
