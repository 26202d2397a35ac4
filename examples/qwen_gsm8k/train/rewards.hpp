// The reward of one GSM8K response: the seed's four rule rewards (dapo::gsm8k) with configurable weights, plus DAPO's
// soft overlong punishment (Eq. 13). Accuracy, which dynamic sampling filters on, is the correctness alone.
#pragma once

#include <dapo/rewards/gsm8k.hpp>

#include <cstdint>
#include <string>

namespace qwen {

struct RewardOptions {
  // Weights on the seed's rewards (each already scaled 2.0 / 0.5 / 0.5 / 4 x 0.125): all 1, so the maximum is 3.5.
  double correctness_weight = 1.0, digit_weight = 1.0, format_weight = 1.0, mark_weight = 1.0;
  dapo::gsm8k::AnswerMode answer_mode = dapo::gsm8k::AnswerMode::kSeed;
  // Soft overlong punishment over the last overlong_cache tokens before max_length (0 disables it).
  int64_t max_length = 512;  // L_max: the generation budget (max_new_tokens)
  int64_t overlong_cache = 0;
  double overlong_factor = 1.0;
  // Benchmarks with random weights only (train --load-format dummy --dummy-accuracy P), which never answer right: when
  // > 0, a response counts as correct with probability P, drawn from a hash of its text, in place of comparing its
  // answer with the reference, so that dynamic sampling filters and keeps groups as for a policy of accuracy P. The
  // other rewards are the seed's as always. 0: the seed's correctness.
  double dummy_accuracy = 0.0;
};

struct ResponseScore {
  dapo::gsm8k::Rewards parts;  // unweighted, as the seed defines them
  double overlong = 0.0;       // <= 0
  double total = 0.0;          // weighted parts + overlong
  bool correct = false;        // the accuracy dynamic sampling and evaluation use
};

// text: the decoded response (special tokens removed); length: its tokens, the stop token included.
ResponseScore score_response(const std::string& text, const std::string& reference, int64_t length,
                             const RewardOptions& options);

}  // namespace qwen
