// Model weights to and from a Hugging Face model directory: config.json plus model.safetensors, or shards listed in
// model.safetensors.index.json. The model's named_parameters() are the one list of weights: loading checks every file
// tensor against it (name, shape), saving writes exactly it. Tied embeddings have no lm_head.weight in the files.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <filesystem>

#include "qwen_gsm8k/model/model.hpp"

namespace qwen {

struct LoadOptions {
  bool allow_unexpected = false;  // tensors in the files that the model lacks: error unless allowed (then skipped)
};

struct SaveOptions {
  int64_t max_shard_bytes = 0;  // 0: one model.safetensors; else shards of at most this size plus an index
};

// Reads dir/config.json, builds the model with weights of `dtype` on `device`, and loads the weights.
Qwen2ForCausalLM load_model(const std::filesystem::path& dir, torch::ScalarType dtype = torch::kFloat32,
                            torch::Device device = torch::kCPU, const LoadOptions& options = {});

// Copies the checkpoint's tensors into the model's parameters (converting F32 / BF16 / F16 to their dtype); every
// parameter must be found exactly once. Throws std::runtime_error naming the file and tensor at fault.
void load_weights(Qwen2ForCausalLM& model, const std::filesystem::path& dir, const LoadOptions& options = {});

// Writes config.json and the weights (dtype as in the model) to dir, each file atomically; creates dir if needed.
void save_model(Qwen2ForCausalLM& model, const std::filesystem::path& dir, const SaveOptions& options = {});

// Hugging Face's default initialisation: normal(0, std) for linear and embedding weights, zero biases, unit norms.
void initialize_weights(Qwen2ForCausalLM& model, double std = 0.02);

}  // namespace qwen
