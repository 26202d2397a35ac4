// A synthetic batch for the update benchmarks and the settings of one optimizer update over it: the shapes of a
// GSM8K rollout without a rollout. Prompt lengths spread 0.8-1.2x around the mean over the groups; response lengths
// 0.5-1.5x around the mean over a group's rows in a shuffled order (deterministic), so rows pad as sampled ones do;
// token ids from the vocabulary's first 10,000 (plain text's range); advantages +1 and -1 in turn.
#pragma once

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <vector>

#include "qwen_gsm8k/train/batch.hpp"
#include "qwen_gsm8k/train/train_options.hpp"

namespace dapo::bench {

struct UpdateBatchShape {
  int64_t groups = 1, group_size = 4, prompt = 98, response = 192;  // prompt and response: mean tokens
};

inline qwen::TrainBatch synthetic_update_batch(const UpdateBatchShape& shape, int64_t vocab) {
  const int64_t ids = std::min<int64_t>(vocab, 10000);
  std::vector<qwen::BatchRow> rows;
  std::vector<float> advantages;
  uint64_t state = 12345;
  const auto next = [&state](int64_t below) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<int64_t>((state >> 33) % static_cast<uint64_t>(below));
  };
  for (int64_t g = 0; g < shape.groups; ++g) {
    const double spread = shape.groups > 1 ? static_cast<double>(g) / static_cast<double>(shape.groups - 1) : 0.5;
    const auto prompt_length =
        std::max<int64_t>(2, std::llround(static_cast<double>(shape.prompt) * (0.8 + 0.4 * spread)));
    std::vector<int64_t> prompt;
    for (int64_t t = 0; t < prompt_length; ++t) prompt.push_back(next(ids));
    for (int64_t r = 0; r < shape.group_size; ++r) {
      const double share =
          static_cast<double>((r * 7 + g * 3) % shape.group_size) / static_cast<double>(shape.group_size - 1);
      const auto response = std::max<int64_t>(1, std::llround(static_cast<double>(shape.response) * (0.5 + share)));
      qwen::BatchRow row{prompt, prompt_length, true};
      for (int64_t t = 0; t < response; ++t) row.tokens.push_back(next(ids));
      rows.push_back(std::move(row));
      advantages.push_back(r % 2 == 0 ? 1.0f : -1.0f);
    }
  }
  return qwen::TrainBatch{qwen::pad_rows(rows, 0), torch::tensor(advantages), {}, shape.groups, shape.group_size};
}

// One optimizer update over the whole batch (one epoch, one mini-batch), `micro_groups` groups per forward and
// backward, lr 1e-6.
inline qwen::TrainOptions one_update_options(const UpdateBatchShape& shape, int64_t micro_groups,
                                             std::optional<torch::ScalarType> autocast, bool shared_prompt) {
  qwen::TrainOptions options;
  options.train_batch_size = shape.groups;
  options.rollout_n = shape.group_size;
  options.ppo_mini_batch_size = shape.groups;
  options.ppo_micro_batch_size = micro_groups;
  options.ppo_epochs = 1;
  options.autocast = autocast;
  options.shared_prompt = shared_prompt;
  options.lr = 1e-6;
  options.loss.group_size = shape.group_size;
  return options;
}

}  // namespace dapo::bench
