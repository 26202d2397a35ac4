// Sampled rollouts kept for reading while a run goes (verl's trainer.rollout_data_dir, TRL's log_completions): for
// each step, output_dir/rollouts/step-NNNNNN.jsonl with one line per response of the first few trained groups: the
// prompt as the model saw it, the response, its reward parts, score and advantage.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <filesystem>
#include <vector>

#include "qwen_gsm8k/text/tokenizer.hpp"
#include "qwen_gsm8k/train/rollout.hpp"

namespace qwen {

// groups: the step's trained groups in batch order; advantages: [groups * group_size] float32, the same order. Writes
// the first `count` groups (all when fewer) atomically; returns the file's path (nothing written when count is 0).
std::filesystem::path write_rollout_log(const std::filesystem::path& output_dir, int64_t step,
                                        const std::vector<Group>& groups, const torch::Tensor& advantages,
                                        const Tokenizer& tokenizer, int64_t count);

}  // namespace qwen
