// The generation engine's model runner, as nano-vllm's: what the scheduler decides, done with tensors on the model's
// device. It owns the slot pool (slot_cache.hpp), each slot's decode state (the token the next step feeds, its
// position, its generated tokens and their log-probs, the first stop's index, the draws' uniforms, the tokens seen),
// the prefills kept for requests whose later samples wait, the model's compute copy and the decode step's CUDA graphs
// (decode_graphs.hpp). Where the weights are float32 and autocast asks for bfloat16 (or float16), the runner computes
// in a copy of the model in that dtype (model/compute_copy.hpp, as vLLM runs a bfloat16 model), with autocast off: no
// cast inside a layer, a bfloat16 residual stream, and none outside: the sampler (fused::sample_tokens) reads the
// logits in that dtype and computes in float32 (vLLM's sampler casts the logits to float32 first). It lives
// as long as its engine: a run begins by resetting the per-run state and writing the weights' current values into the
// copy in place, so that the graphs captured in an earlier run are replayed, not captured again. It knows nothing of
// requests' order or of when to check: the scheduler (scheduler.hpp) does.
//
// Shapes: S = slots, R = the step's rows, N = max_new_tokens, V = vocabulary, C = slot capacity, W = the step's window.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "qwen_gsm8k/engine/decode_graphs.hpp"
#include "qwen_gsm8k/engine/engine.hpp"
#include "qwen_gsm8k/engine/scheduler.hpp"
#include "qwen_gsm8k/engine/slot_cache.hpp"
#include "qwen_gsm8k/model/autocast.hpp"
#include "qwen_gsm8k/model/compute_copy.hpp"
#include "qwen_gsm8k/model/host_door.hpp"

namespace qwen {

class ModelRunner {
 public:
  // Computes in `compute_dtype` (a compute copy where the weights' dtype differs), its keys and values in the pool too;
  // `recorder`: the graphs' (null: CUDA's where there are CUDA graphs).
  ModelRunner(Qwen2ForCausalLM& model, const EngineOptions& options, torch::ScalarType cache_dtype,
              std::shared_ptr<GraphRecorder> recorder);

  // A run's start: its counts go to `stats` (prefill calls, rows and tokens, the pool's bytes) until the next begin;
  // it samples as `run` says (buffers it needs are made the first time and kept); no sequence is live; the weights'
  // casts take their current values (in place).
  void begin(EngineStats& stats, const RunOptions& run);
  void end();  // a run's end: what its graphs read is noted for the next begin
  torch::ScalarType cache_dtype() const { return cache_dtype_; }
  torch::Device device() const { return device_; }
  // Whether it computes in a copy of the model (then autocast must be off while it runs: see the loop).
  bool has_compute_copy() const { return copy_ != nullptr; }
  int64_t kept_bytes() const { return cache_.bytes() + (copy_ ? copy_->bytes() : 0); }  // the pool and the copy

  // Whether decode steps run at the graphs' rounded shapes (graphs on and capturable here, or graph_shapes).
  bool rounded_shapes() const { return options_.graph_shapes || graphs_.active(); }

  // Prefills the admission's prompts in one batch, forks each prompt's keys and values into its placed sequences'
  // slots (a kept prefill's too), keeps and lets go what the admission says, and draws each sequence's first token
  // from its prompt's last logits.
  void admit(const Admission& admission);
  // One token for every row of `shape`, as a CUDA graph's replay where graphs are on.
  void decode(const StepShape& shape);
  // The check's one host read: finished_at of rows [0, rows) (the index of each row's first stop token, or -1).
  std::vector<int64_t> finished_flags(int64_t rows) const;
  // The generated tokens [done, N] and log-probs (none unless return_logprobs) of these rows, on their way to the
  // host: gathered and queued now, before anything queued later (a compaction, the next step) changes those rows.
  struct Outputs {
    host_door::Fetch tokens, logprobs;
  };
  Outputs fetch_outputs(const std::vector<int64_t>& rows) const;
  void move(const Compaction& moves);  // the scheduler's compaction, on the device

  int64_t graph_captures() const { return graphs_.captures(); }  // since construction
  int64_t graph_replays() const { return graphs_.replays(); }

 private:
  struct Prefill {  // per layer the keys and values [P, KV, L, D]; the logits [P, V] at each prompt's last position
    std::vector<torch::Tensor> keys, values;
    torch::Tensor logits;
  };
  Prefill prefill(const std::vector<const std::vector<int64_t>*>& prompts);
  void draw_first_tokens(const Admission& admission, const std::vector<torch::Tensor>& first_logits);
  void decode_step(int64_t rows, int64_t window);  // the device work of a step: what a CUDA graph captures
  torch::Tensor is_stop(const torch::Tensor& token) const;
  // One token per row as the run samples ([R] int64: its argmax when greedy, else drawn at the row's uniform [R]) and,
  // where the run returns log-probs, log p(token) under softmax(logits / temperature), temperature 1 when greedy
  // ([R] float32, else undefined). logits [R, V] in the compute dtype; seen [R, W] (the repetition penalty's).
  std::pair<torch::Tensor, torch::Tensor> draw(const torch::Tensor& logits, const torch::Tensor& seen,
                                               const torch::Tensor& uniforms) const;

  Qwen2ForCausalLM& model_;
  const EngineOptions& options_;
  RunOptions run_;       // the current run's sampling
  int64_t variant_ = 0;  // its index in variants_: part of the graphs' key
  std::vector<RunOptions> variants_;
  EngineStats* stats_ = nullptr;  // the current run's
  torch::Device device_;
  int64_t slots_, capacity_;
  torch::ScalarType cache_dtype_;
  SlotCache cache_;
  std::unique_ptr<ComputeCopy> copy_;  // null: the model itself computes
  Qwen2ForCausalLM& compute() { return copy_ ? copy_->model() : model_; }
  std::vector<const void*> weight_addresses();  // the weights' and RoPE table's (made here if missing)
  std::vector<const void*> weight_addresses_;   // the weights' at the last run's end: checked at each run's start
  DecodeGraphs graphs_;
  std::map<int64_t, Prefill> kept_;  // by request: a half-admitted request's prompt, [1, KV, P, D] and [1, V]
  // Per slot: the token the next step feeds, its position, the index of the next token, the first stop's index (-1),
  // the generated tokens; and as the current run needs them (else undefined), their log-probs, the tokens seen
  // (repetition penalty) and the draws' uniforms, each made the first time a run needs it and kept in kept_buffers_.
  torch::Tensor next_token_, positions_, generated_index_, finished_at_, tokens_, logprobs_, seen_, uniforms_;
  std::map<std::string, torch::Tensor> kept_buffers_;
  std::vector<torch::Tensor*> per_row_;  // the current run's per-slot tensors (compaction moves them)
  torch::Tensor stop_ids_;
};

}  // namespace qwen
