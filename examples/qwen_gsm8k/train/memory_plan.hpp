// What a training run holds on its device, phase by phase, predicted from the model's config.json and the options
// alone (no weight is read): the rollout (KV cache at the round's size, sampling), the no-grad log-prob passes (old and
// reference log-probs) and the update (gradients, the activations of the largest micro-batch at its worst-case length,
// with or without checkpointing, the lm-head's chunk). Each phase adds what is resident throughout: the weights,
// AdamW's state (from the first update on) and the KL reference; the phases after the rollout add the rollout engine
// the trainer keeps for its CUDA graphs (its KV cache and compute copy), unless free_cache_engine. The peak is the
// largest phase.
//
// The per-token activation bytes are LibTorch's own, counted exactly by the tracking CPU allocator at three model
// shapes (benchmarks/memory_bench, docs/benchmarks.md): float32 4 (12 H + 4 I + 2) bytes per token per decoder layer,
// bfloat16 or float16 autocast 20 H + 6 I + 8 (the fused training operators, model/fused_training.hpp), plus the
// attention's probabilities on the eager path (the CPU before LibTorch 2.14: 4 or 6 x heads x T) or the fused kernel's
// log-sum-exp (4 x heads); with checkpointing a layer keeps its float32 input, 4 H, and one layer at a time holds the
// rest while it is recomputed. On CUDA the caching allocator reserves more than tensors hold (its blocks,
// fragmentation): the plan counts tensors, as torch.cuda.max_memory_allocated does, and the CUDA check leaves a margin
// (kCudaReservedMargin).
//
// Shapes: H hidden, I intermediate, V vocabulary, KV key/value heads, D head dimension, T a row's prompt + response.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "qwen_gsm8k/model/config.hpp"
#include "qwen_gsm8k/train/train_options.hpp"

namespace qwen {

struct MemoryPlanInput {
  Config config;                  // the model's shape (config.json)
  TrainOptions options;           // batch sizes, lengths, autocast, checkpointing, micro-batches, KL reference
  int64_t max_prompt_tokens = 0;  // the longest prompt as the chat template renders it (the training data's)
  int64_t weight_bytes = 4;       // 4: float32 weights (--dtype float32), 2: bfloat16
  bool cuda = false;              // CUDA: the fused attention; else the CPU's path (eager_attention)
  bool eager_attention = true;    // the CPU's attention keeps its probabilities (LibTorch before 2.14)
  int world_size = 1;             // data-parallel ranks: each holds its share of every batch
  // On the CPU, where the tensors share the process's memory: what the process holds besides them (LibTorch, the
  // tokenizer, the data), added to every phase. 0 counts tensors only; the train command passes kCpuProcessBytes.
  int64_t process_bytes = 0;
};

// The train command's resident memory before any tensor of the model exists (LibTorch, the Qwen2.5 tokenizer, GSM8K's
// training set), measured: the peak resident set of a train run with the 2-layer tiny fixture, 243 MiB (GNU time,
// Debian 12, LibTorch 1.13, 2026-12-04).
inline constexpr int64_t kCpuProcessBytes = int64_t{243} << 20;

struct MemoryItem {
  std::string name;
  int64_t bytes = 0;
};

struct MemoryPhase {
  std::string name;
  std::vector<MemoryItem> items;
  int64_t bytes() const;
};

struct MemoryPlan {
  std::vector<MemoryPhase> phases;  // rollout, log-probs, update
  // What the plan assumed, for a reader to check against the run.
  int64_t rollout_rows = 0;                // rows per generate call on a rank
  int64_t longest_row = 0;                 // prompt + response tokens
  int64_t update_tokens = 0;               // the largest update micro-batch, rows x longest row (padded)
  int64_t logprob_tokens = 0;              // the same for the no-grad log-prob passes
  int64_t activation_bytes_per_token = 0;  // per decoder layer

  const MemoryPhase& peak_phase() const;
  int64_t peak_bytes() const { return peak_phase().bytes(); }
  std::vector<std::pair<std::string, int64_t>> assumed() const;  // the five above, by their JSON names
  std::string table() const;                                     // one block per phase, GiB, the peak marked
  nlohmann::json to_json() const;  // {"peak_bytes", "peak_phase", "phases": [{"name", "bytes", "items": {...}}], ...}
};

MemoryPlan plan_memory(const MemoryPlanInput& input);

// The CUDA check wants the plan's peak times this within the GPU's free memory: the caching allocator reserves more
// than its tensors hold (block rounding, fragmentation; 11 % more on the H200's seed step: 33.99 against 30.68 GiB).
inline constexpr double kCudaReservedMargin = 1.15;

// "12.34 GiB"
std::string gib_text(int64_t bytes);

// Settings whose plan peaks within available_bytes, as command-line flags, the least change first: checkpointing,
// then a token budget (the largest power of two that fits) with or without it, then autocast, then fewer rows per
// generate call where the rollout is what does not fit. Empty when none of them fits.
std::vector<std::string> settings_that_fit(const MemoryPlanInput& input, int64_t available_bytes);

// The parameters of a Qwen2 model of this config: all of them, and those of the decoder layers' linear maps (the
// weights autocast casts, and the KL reference keeps in the autocast dtype).
struct ParameterCounts {
  int64_t total = 0, layer_linear = 0;  // layer_linear: one layer's
};
ParameterCounts count_parameters(const Config& config);

// Activation bytes one decoder layer keeps per token for the backward (see the header comment), T = the row's length.
int64_t activation_bytes_per_token(const Config& config, bool autocast, bool eager_attention, bool cuda, int64_t T);

}  // namespace qwen
