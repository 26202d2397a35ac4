// Scoring a response: four rule rewards, their weights, and the length penalty.
#include "qwen_gsm8k/train/rewards.hpp"

#include <dapo/core/reward.hpp>

namespace qwen {

ResponseScore score_response(const std::string& text, const std::string& reference, int64_t length,
                             const RewardOptions& options) {
  ResponseScore score;
  score.parts = dapo::gsm8k::score(text, reference, options.answer_mode);
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
