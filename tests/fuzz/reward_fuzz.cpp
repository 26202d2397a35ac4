// Fuzz target: the GSM8K rewards (dapo::gsm8k, both answer modes) and the driver's weighted score with overlong
// shaping, on arbitrary response text. The input's first line is the reference, the rest the response; its length
// in bytes stands for the token count. Properties: every part takes only its defined values, the total is their
// weighted sum plus an overlong penalty in [-factor, 0], and `correct` is the correctness part.
#include <cmath>

#include "fuzz_support.hpp"
#include "qwen_gsm8k/train/rewards.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const std::string_view input = dapo::fuzz::as_text(data, size);
  const std::size_t newline = input.find('\n');
  const std::string reference(input.substr(0, newline));
  const std::string response(newline == std::string_view::npos ? std::string_view() : input.substr(newline + 1));
  for (const auto mode : {dapo::gsm8k::AnswerMode::kSeed, dapo::gsm8k::AnswerMode::kLenient}) {
    qwen::RewardOptions options;
    options.answer_mode = mode;
    options.max_length = 64;
    options.overlong_cache = 16;
    const auto length = static_cast<int64_t>(response.size());
    const qwen::ResponseScore score = qwen::score_response(response, reference, length, options);
    const auto& parts = score.parts;
    const double marks = parts.mark / dapo::gsm8k::kMarkReward;
    if ((parts.correctness != 0.0 && parts.correctness != dapo::gsm8k::kCorrectnessReward) ||
        (parts.digit != 0.0 && parts.digit != dapo::gsm8k::kDigitReward) ||
        (parts.hard_format != 0.0 && parts.hard_format != dapo::gsm8k::kHardFormatReward) || marks < 0.0 ||
        marks > 4.0 || marks != std::floor(marks)) {
      dapo::fuzz::finding("a reward part outside its values");
    }
    if (!(score.overlong <= 0.0 && score.overlong >= -options.overlong_factor)) {
      dapo::fuzz::finding("overlong penalty outside [-factor, 0]");
    }
    if (std::abs(score.total - (parts.total() + score.overlong)) > 1e-12) {
      dapo::fuzz::finding("total is not the sum of the parts and the penalty");
    }
    if (score.correct != (parts.correctness > 0.0)) dapo::fuzz::finding("correct disagrees with the correctness part");
    if (dapo::gsm8k::score(response, reference, mode).total() != parts.total()) {
      dapo::fuzz::finding("score_response's parts differ from dapo::gsm8k::score");
    }
  }
  return 0;
}
