// Rollouts: each problem becomes a chat prompt, the policy samples G responses to it, and every response is decoded
// and scored. A Group (one prompt and its responses) is the unit dynamic sampling keeps or drops.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "qwen_gsm8k/data/data.hpp"
#include "qwen_gsm8k/model/generation.hpp"
#include "qwen_gsm8k/text/tokenizer.hpp"
#include "qwen_gsm8k/train/rewards.hpp"

namespace qwen {

// The seed project's system prompt: "answer in the following format: <think> your reasoning </think> <answer> your
// answer </answer>", in Chinese, with its newlines.
inline const std::string kSeedSystemPrompt =
    "\n\xE6\x8C\x89\xE7\x85\xA7\xE5\xA6\x82\xE4\xB8\x8B\xE6\xA0\xBC\xE5\xBC\x8F\xE5\x9B\x9E\xE7\xAD\x94\xE9\x97\xAE"
    "\xE9\xA2\x98\xEF\xBC\x9A\n<think>\n\xE4\xBD\xA0\xE7\x9A\x84\xE6\x80\x9D\xE8\x80\x83\xE8\xBF\x87\xE7\xA8\x8B\n"
    "</think>\n<answer>\n\xE4\xBD\xA0\xE7\x9A\x84\xE5\x9B\x9E\xE7\xAD\x94\n</answer>\n";

// The chat prompt of a question (system prompt, user turn, generation prompt), tokenized.
std::vector<int64_t> prompt_ids(const Tokenizer& tokenizer, const std::string& system_prompt,
                                const std::string& question);

struct Response {
  std::vector<int64_t> ids;  // generated tokens, the stop token included
  std::string text;          // decoded, special tokens removed
  bool truncated = false;    // hit max_new_tokens without a stop token
  ResponseScore score;
  // The sampler's log p of each of ids (GenerationOutput::logprobs): verl's rollout_log_probs, what rollout correction
  // compares the trainer's log-probs with. Empty when the rollout did not record them (greedy evaluation, tests).
  std::vector<float> logprobs;
};

struct Group {
  Problem problem;
  std::vector<int64_t> prompt;
  std::vector<Response> responses;  // group_size of them
};

struct RolloutOptions {
  int64_t group_size = 4;
  GenerationOptions generation;  // max_new_tokens, stop ids, sampling, pad id (the seed is set per call)
  RewardOptions rewards;
  std::string system_prompt = kSeedSystemPrompt;
  int64_t max_batch_rows = 0;  // sequences per generate() call; 0: all at once
};

// (rows done, rows in all) after each generate() call of a rollout.
using ChunkProgress = std::function<void(int64_t, int64_t)>;

struct RolloutStats {
  int64_t generated_tokens = 0;
  double seconds = 0.0;
};

// How many of `problems` greedy decoding answers correctly, one response each, with the prompt, budget, stop ids and
// rewards of `options` (its sampling and group size are replaced). A count, not a fraction, so that data-parallel
// ranks can sum theirs.
// on_chunk, when given, is called after each generate() call (options.max_batch_rows rows at a time) with the rows
// done and the rows in all: a progress line for long evaluations.
int64_t greedy_correct(Qwen2ForCausalLM& model, const Tokenizer& tokenizer, const std::vector<Problem>& problems,
                       const RolloutOptions& options, const ChunkProgress& on_chunk = {});

// Groups as a flat list of numbers (token ids, bytes of the texts, scores; every value exact in a double) and back:
// how data-parallel ranks exchange their rollouts through a collective.
std::vector<double> encode_groups(const std::vector<Group>& groups);
std::vector<Group> decode_groups(const double* values, std::size_t count);

// group_size responses for each problem, sampled with `seed`; appends timing to stats when given; on_chunk as for
// greedy_correct.
std::vector<Group> rollout(Qwen2ForCausalLM& model, const Tokenizer& tokenizer, const std::vector<Problem>& problems,
                           const RolloutOptions& options, uint64_t seed, RolloutStats* stats = nullptr,
                           const ChunkProgress& on_chunk = {});

}  // namespace qwen
