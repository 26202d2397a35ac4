// GSM8K-style problems: reading them from JSON lines (GSM8K's own "#### N" answers, or a plain numeric answer field)
// and a seeded, resumable order to draw them in. No LibTorch, no tokenizer, no prompt formatting.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace qwen {

// The one arithmetic step behind a generated demo problem (see demo_problems.hpp): left op right = reference.
struct Arithmetic {
  enum class Operation { kAdd, kSubtract };
  int64_t left = 0;
  Operation operation = Operation::kAdd;
  int64_t right = 0;

  int64_t result() const { return operation == Operation::kAdd ? left + right : left - right; }
};

// Every member has a default, so `Problem{question, reference}` stays warning-free under -Wextra.
struct Problem {
  std::string question = {};
  // The normalised final answer the model's is compared with (dapo::gsm8k::correctness_reward): "1080", "-7", "3.5".
  std::string reference = {};
  // Only demo problems carry their arithmetic (for the worked solution of the warm start); GSM8K problems have none.
  std::optional<Arithmetic> arithmetic = std::nullopt;
};

enum class AnswerFormat {
  kGsm8k,   // the field is GSM8K's rationale ending in "#### N": dapo::gsm8k::reference_answer ("#### 1,080" -> "1080")
  kNumber,  // the field is the answer itself: a JSON number or a numeric string (see load_problems for the normal form)
};

// Which JSON fields hold the question and the answer, and how the answer is written. A name with dots that is not
// itself a key of the line is a path of object keys and list indices, as verl's preprocessed data needs:
// "reward_model.ground_truth" (the number, AnswerFormat::kNumber). A question field that holds a list of chat
// messages ({"role", "content"}, verl's "prompt") gives its last user message's content.
struct DataFields {
  std::string question = "question";
  std::string answer = "answer";
  AnswerFormat format = AnswerFormat::kGsm8k;
};

// The fields of a named layout (the command line's --data-preset):
//   gsm8k          question, answer ("... #### N"): GSM8K's own files, Hugging Face's openai/gsm8k
//   gsm8k_chinese  question_zh-cn, answer_only (a number): the seed project's Chinese GSM8K
//   verl           prompt (chat messages: the last user turn), reward_model.ground_truth (a number): verl's
//                  examples/data_preprocess/gsm8k.py
// Throws std::invalid_argument naming the layouts for any other name.
DataFields data_preset(const std::string& name);

// What to do with a malformed line: stop with an error naming it, or skip it and count it.
enum class BadLines { kError, kSkip };

struct Dataset {
  std::vector<Problem> problems;
  int64_t skipped_lines = 0;  // malformed lines passed over under BadLines::kSkip (blank lines are not counted)
  std::filesystem::path source;
};

// Reads one JSON object per line; blank lines are ignored. Messages name the command line's options that fix what
// they report (--skip-bad-lines, --answer-format, --question-field, --answer-field, --data-preset). A malformed line
// (invalid JSON, not an object, a missing or ill-typed field, an empty question, no "####", a non-numeric kNumber
// answer) throws std::invalid_argument
// "<file>:<line>: <what is wrong>" (lines count from 1), or under BadLines::kSkip is skipped and counted. A file
// that cannot be read throws std::runtime_error; a file with no problem at all throws std::invalid_argument.
//
// kNumber answers are normalised so that they compare as text with what dapo::gsm8k extracts from a response:
//   JSON numbers: integers as printed (-7 -> "-7"); others in shortest round-trip fixed notation without trailing
//                 zeros (3.50 -> "3.5", 72.0 -> "72", 1e3 -> "1000").
//   strings:      optional surrounding whitespace, an optional '-', digits with optional well-formed thousands groups,
//                 an optional decimal part: "72" -> "72", "1,080" -> "1080" (as reference_answer does for GSM8K),
//                 "007" -> "7", "3.50" -> "3.5", "-0" -> "0". Anything else ("1,08", "3/4", "1e3", "") is malformed.
Dataset load_problems(const std::filesystem::path& file, const DataFields& fields = {},
                      BadLines bad = BadLines::kError);

// A seeded shuffled order over [0, count), epoch after epoch. Epoch e visits every index once, in a permutation that
// depends only on (seed, e): a sampler restored from state() continues exactly where the saved one would have, and
// the order is the same with every standard library (std::mt19937_64 and our own Fisher-Yates; std::shuffle and
// std::uniform_int_distribution are implementation-defined).
class ProblemSampler {
 public:
  // Throws std::invalid_argument when count is 0.
  ProblemSampler(std::size_t count, uint64_t seed);

  // The next n indices; crosses epoch boundaries (so n may exceed count).
  std::vector<std::size_t> next(std::size_t n);

  std::size_t count() const { return count_; }
  uint64_t seed() const { return seed_; }
  int64_t epoch() const { return epoch_; }            // epochs completed so far
  std::size_t position() const { return position_; }  // indices already drawn from the current epoch, < count

  // {"seed", "count", "epoch", "position"}: all a sampler needs to resume.
  nlohmann::json state() const;
  // Validates every field; throws std::invalid_argument naming the field, its value and the expectation.
  static ProblemSampler from_state(const nlohmann::json& state);

 private:
  void shuffle_epoch();  // order_ = the permutation of epoch_

  std::size_t count_;
  uint64_t seed_;
  int64_t epoch_ = 0;
  std::size_t position_ = 0;
  std::vector<std::size_t> order_;
};

}  // namespace qwen
