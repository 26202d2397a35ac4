// The logits processors, written as their Hugging Face counterparts (RepetitionPenaltyLogitsProcessor,
// TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper with min_tokens_to_keep = 1).
#include "qwen_gsm8k/model/sampling.hpp"

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

namespace qwen {

void SamplingOptions::validate() const {
  if (!(std::isfinite(temperature) && temperature >= 0.0)) {
    throw std::invalid_argument("sampling: temperature is " + std::to_string(temperature) + ", expected >= 0");
  }
  if (top_k < 0) throw std::invalid_argument("sampling: top_k is " + std::to_string(top_k) + ", expected >= 0");
  if (!(top_p > 0.0 && top_p <= 1.0)) {
    throw std::invalid_argument("sampling: top_p is " + std::to_string(top_p) + ", expected a value in (0, 1]");
  }
  if (!(std::isfinite(repetition_penalty) && repetition_penalty > 0.0)) {
    throw std::invalid_argument("sampling: repetition_penalty is " + std::to_string(repetition_penalty) +
                                ", expected > 0");
  }
}

torch::Tensor process_logits(const torch::Tensor& logits, const torch::Tensor& seen_tokens,
                             const SamplingOptions& options) {
  torch::Tensor scores = logits.to(torch::kFloat32);
  constexpr float kRemoved = -std::numeric_limits<float>::infinity();
  if (options.repetition_penalty != 1.0) {
    const torch::Tensor seen = scores.gather(1, seen_tokens);
    const torch::Tensor penalised =
        torch::where(seen < 0, seen * options.repetition_penalty, seen / options.repetition_penalty);
    scores = scores.scatter(1, seen_tokens, penalised);
  }
  if (!options.greedy() && options.temperature != 1.0) scores = scores / options.temperature;
  if (options.top_k > 0) {
    const int64_t k = std::min<int64_t>(options.top_k, scores.size(-1));
    const torch::Tensor kth = std::get<0>(scores.topk(k, -1)).narrow(-1, k - 1, 1);
    scores = scores.masked_fill(scores < kth, kRemoved);
  }
  if (options.top_p < 1.0) {
    const auto [sorted, order] = scores.sort(-1, /*descending=*/false);
    torch::Tensor remove_sorted = sorted.softmax(-1).cumsum(-1) <= (1.0 - options.top_p);
    remove_sorted.narrow(-1, remove_sorted.size(-1) - 1, 1).fill_(false);  // always keep the most likely token
    scores = scores.masked_fill(remove_sorted.scatter(1, order, remove_sorted), kRemoved);
  }
  return scores;
}

}  // namespace qwen
