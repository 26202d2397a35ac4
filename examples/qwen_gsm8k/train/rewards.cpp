// Scoring a response: four rule rewards, their weights, and the length penalty.
#include "qwen_gsm8k/train/rewards.hpp"

#include <dapo/core/reward.hpp>

#include <cstdint>

namespace qwen {
namespace {

// A draw in [0, 1) from the text alone (FNV-1a, then SplitMix64's finaliser): the same text always draws the same.
double text_uniform(const std::string& text) {
  uint64_t hash = 14695981039346656037ULL;
  for (const char c : text) hash = (hash ^ static_cast<unsigned char>(c)) * 1099511628211ULL;
  hash = (hash ^ (hash >> 30)) * 0xbf58476d1ce4e5b9ULL;
  hash = (hash ^ (hash >> 27)) * 0x94d049bb133111ebULL;
  hash ^= hash >> 31;
  return static_cast<double>(hash >> 11) * 0x1.0p-53;
}

}  // namespace

ResponseScore score_response(const std::string& text, const std::string& reference, int64_t length,
                             const RewardOptions& options) {
  ResponseScore score;
  score.parts = dapo::gsm8k::score(text, reference, options.answer_mode);
  if (options.dummy_accuracy > 0.0) {
    score.parts.correctness = text_uniform(text) < options.dummy_accuracy ? dapo::gsm8k::kCorrectnessReward : 0.0;
  }
  score.correct = score.parts.correctness > 0.0;
  if (options.overlong_cache > 0) {
    score.overlong =
        dapo::overlong_penalty(length, options.max_length, options.overlong_cache, options.overlong_factor);
  }
  score.total = options.correctness_weight * score.parts.correctness + options.digit_weight * score.parts.digit +
                options.format_weight * score.parts.hard_format + options.mark_weight * score.parts.mark +
                score.overlong;
  return score;
}

}  // namespace qwen
