// Model weights to and from a Hugging Face model directory: config.json plus model.safetensors, or shards listed in
// model.safetensors.index.json. The model's named_parameters() are the one list of weights: loading checks every file
// tensor against it (name, shape), saving writes exactly it. Tied embeddings have no lm_head.weight in the files.
// Saving leaves what transformers' save_pretrained leaves (config.json, generation_config.json, the weights); the
// tokenizer's files are the caller's business.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>

#include "qwen_gsm8k/model/model.hpp"

namespace qwen {

// Receives one line of progress at a time (no newline), for a console; the model layer prints nothing itself.
using ProgressLine = std::function<void(const std::string& line)>;

struct LoadOptions {
  bool allow_unexpected = false;  // tensors in the files that the model lacks: error unless allowed (then skipped)
  ProgressLine progress{};        // a line before each weights file and one when done; none: silent
};

struct SaveOptions {
  // transformers' max_shard_size in bytes: weights above it are split, in parameter order, into
  // model-0000k-of-0000n.safetensors with model.safetensors.index.json (a tensor larger than the limit gets a shard of
  // its own, as in huggingface_hub's split_torch_state_dict_into_shards). 0, or weights that fit: one
  // model.safetensors.
  int64_t max_shard_bytes = 0;
  // The Hugging Face directory the model was loaded from. Its config.json is written back with every field kept and
  // only the dtype updated ("torch_dtype", and transformers 5's "dtype", whichever it has), and its
  // generation_config.json is copied. Empty, or a file absent there: config.json from the model's Config, and a
  // generation_config.json derived from the config as transformers derives one (GenerationConfig.from_model_config).
  std::filesystem::path source_dir{};
  ProgressLine progress{};  // a line before each weights file; none: silent
};

// Reads dir/config.json, builds the model with weights of `dtype` on `device`, and loads the weights.
Qwen2ForCausalLM load_model(const std::filesystem::path& dir, torch::ScalarType dtype = torch::kFloat32,
                            torch::Device device = torch::kCPU, const LoadOptions& options = {});

// Copies the checkpoint's tensors into the model's parameters (converting F32 / BF16 / F16 to their dtype); every
// parameter must be found exactly once. Throws std::runtime_error naming the file and tensor at fault.
void load_weights(Qwen2ForCausalLM& model, const std::filesystem::path& dir, const LoadOptions& options = {});

// Writes config.json, generation_config.json and the weights (dtype as in the model) to dir, each file atomically;
// creates dir if needed and removes weights files of an earlier save that this one does not replace (a stale index
// would otherwise win over a new model.safetensors). Throws std::invalid_argument when source_dir/config.json
// describes another model than `model`.
void save_model(Qwen2ForCausalLM& model, const std::filesystem::path& dir, const SaveOptions& options = {});

// Hugging Face's default initialisation: normal(0, std) for linear and embedding weights, zero biases, unit norms.
void initialize_weights(Qwen2ForCausalLM& model, double std = 0.02);

// A model of `config`'s shape with fresh random weights and nothing read (transformers' from_config, vLLM's
// load_format dummy): seeded with `seed`, built on the CPU, moved to `device`, initialised there by
// initialize_weights (quick on a GPU even for a 1.5B model), then cast to `dtype`.
Qwen2ForCausalLM random_model(const Config& config, uint64_t seed, torch::Device device = torch::kCPU,
                              torch::ScalarType dtype = torch::kFloat32);

}  // namespace qwen
