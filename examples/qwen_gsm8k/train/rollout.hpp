// Rollouts: each problem becomes a chat prompt, the policy samples G responses to it, and every response is decoded
// and scored. A Group (one prompt and its responses) is the unit dynamic sampling keeps or drops.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "qwen_gsm8k/data/data.hpp"
#include "qwen_gsm8k/engine/engine.hpp"
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
  int64_t max_batch_rows = 0;  // the engine's slots (sequences in flight at once); 0: every row of the call
  int64_t check_every = 8;     // decode steps between reads of the finished flags (EngineOptions::check_every)
  bool cuda_graphs = true;     // decode steps as CUDA graphs on CUDA (EngineOptions::cuda_graphs)
};

// (rows done, rows in all) after each generate() call of a rollout.
using ChunkProgress = std::function<void(int64_t, int64_t)>;

struct RolloutStats {
  int64_t generated_tokens = 0;
  double seconds = 0.0;
  int64_t decode_calls = 0, rows_computed = 0, prefill_rows = 0, sequences = 0;  // the engine's (EngineStats)
  int64_t prefill_calls = 0, checks = 0, graph_captures = 0, graph_replays = 0;  // the engine's too
  int64_t host_reads = 0, host_fetches = 0, host_copies = 0;
  void add(const EngineStats& engine);
};

// The engine's settings for a rollout's sequences: budget, stop ids, sampling, log-probs, slots (max_batch_rows, or
// `rows` when 0), checks, the longest prompt.
EngineOptions rollout_engine_options(const RolloutOptions& options, int64_t rows, int64_t max_prompt_tokens);

// The seed of the request of the `index`-th prompt of a rollout seeded `seed`: its samples draw from
// sequence_seed(request_seed(seed, index), sample).
uint64_t request_seed(uint64_t seed, int64_t index);

// The text of sampled ids, special tokens skipped. The model's vocabulary is padded past the tokenizer's (Qwen2.5:
// 151936 rows, 151665 tokens); a sampled padding id has no text, as in Hugging Face's decode.
std::string response_text(const Tokenizer& tokenizer, const std::vector<int64_t>& ids);

// The longest chat prompt (`system_prompt` and a question, rendered and encoded) of `problems`, in tokens; 0 if none.
int64_t longest_prompt_tokens(const Tokenizer& tokenizer, const std::string& system_prompt,
                              const std::vector<Problem>& problems);

// A finished sequence as a Response: decoded (special tokens and ids past the tokenizer's vocabulary dropped) and
// scored against `reference`.
Response make_response(const Tokenizer& tokenizer, EngineSequence&& sequence, const std::string& reference,
                       const RewardOptions& rewards);

// How many of `problems` greedy decoding answers correctly, one response each, with the prompt, budget, stop ids and
// rewards of `options` (its sampling and group size are replaced). A count, not a fraction, so that data-parallel
// ranks can sum theirs.
// on_chunk, when given, is called as every options.max_batch_rows rows (or all) have finished, with the rows done and
// the rows in all: a progress line for long evaluations.
int64_t greedy_correct(Qwen2ForCausalLM& model, const Tokenizer& tokenizer, const std::vector<Problem>& problems,
                       const RolloutOptions& options, const ChunkProgress& on_chunk = {});
// The same through an engine the caller keeps (a training run's rollout engine: its graphs serve evaluations too).
int64_t greedy_correct(GenerationEngine& engine, const Tokenizer& tokenizer, const std::vector<Problem>& problems,
                       const RolloutOptions& options, const ChunkProgress& on_chunk = {});

// Groups as a flat list of numbers (token ids, bytes of the texts, scores; every value exact in a double) and back:
// how data-parallel ranks exchange their rollouts through a collective.
std::vector<double> encode_groups(const std::vector<Group>& groups);
std::vector<Group> decode_groups(const double* values, std::size_t count);

// group_size responses for each problem through the generation engine (one prefill per prompt, continuous batching
// over max_batch_rows slots), sampled with `seed`; appends timing and counts to stats when given; on_chunk is called
// as every max_batch_rows rows (or all) have finished.
std::vector<Group> rollout(Qwen2ForCausalLM& model, const Tokenizer& tokenizer, const std::vector<Problem>& problems,
                           const RolloutOptions& options, uint64_t seed, RolloutStats* stats = nullptr,
                           const ChunkProgress& on_chunk = {});
// The same through an engine the caller keeps (its options as rollout_engine_options gives them for `options`).
std::vector<Group> rollout(GenerationEngine& engine, const Tokenizer& tokenizer, const std::vector<Problem>& problems,
                           const RolloutOptions& options, uint64_t seed, RolloutStats* stats = nullptr,
                           const ChunkProgress& on_chunk = {});

}  // namespace qwen
