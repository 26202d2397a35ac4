// Fuzz target: GSM8K data files (JSON lines), read as GSM8K's own rows ("#### N" answers) and as verl's preprocessed
// rows (dotted field paths, numeric answers), stopping at a bad line and skipping bad lines. An accepted problem has
// a question and a reference in the normal form load_problems promises.
#include <dapo/rewards/gsm8k.hpp>

#include "fuzz_support.hpp"
#include "qwen_gsm8k/data/data.hpp"

namespace {

// "-?digits(.digits)?" with no leading zeros, no trailing fractional zeros and no "-0": what both formats normalise to.
bool normal_form(const std::string& reference) {
  std::size_t pos = reference.starts_with('-') ? 1 : 0;
  const std::size_t dot = reference.find('.');
  const std::string whole = reference.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
  if (whole.empty() || whole.find_first_not_of("0123456789") != std::string::npos) return false;
  if (whole.size() > 1 && whole.front() == '0') return false;
  if (dot != std::string::npos) {
    const std::string fraction = reference.substr(dot + 1);
    if (fraction.empty() || fraction.find_first_not_of("0123456789") != std::string::npos || fraction.back() == '0') {
      return false;
    }
  }
  return reference != "-0";
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const auto path = dapo::fuzz::write_scratch("data.jsonl", dapo::fuzz::as_text(data, size));
  const qwen::DataFields gsm8k;
  const qwen::DataFields verl{"prompt.0.content", "reward_model.ground_truth", qwen::AnswerFormat::kNumber};
  for (const auto& fields : {gsm8k, verl}) {
    for (const auto bad : {qwen::BadLines::kError, qwen::BadLines::kSkip}) {
      dapo::fuzz::expect_clean_rejection(path.string(), [&] {
        const qwen::Dataset dataset = qwen::load_problems(path, fields, bad);
        for (const auto& problem : dataset.problems) {
          if (problem.question.empty()) dapo::fuzz::finding("an accepted problem has no question");
          if (fields.format != qwen::AnswerFormat::kNumber) continue;
          if (!normal_form(problem.reference)) {
            dapo::fuzz::finding("reference \"" + problem.reference + "\" is not in normal form");
          }
          // A model that answers with the reference itself earns the full correctness reward.
          const std::string response = "<think>t</think><answer>" + problem.reference + "</answer>";
          if (dapo::gsm8k::correctness_reward(response, problem.reference, dapo::gsm8k::AnswerMode::kLenient) !=
              dapo::gsm8k::kCorrectnessReward) {
            dapo::fuzz::finding("the reference \"" + problem.reference + "\" itself is not graded correct");
          }
        }
      });
    }
  }
  return 0;
}
