// A benchmark's model: a named shape (support/shapes.hpp) with random weights on the device, and the CPU's threads
// set for it. One set-up for the benchmarks that train, so that their weights are drawn the same way.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>

#include "qwen_gsm8k/cli/runtime.hpp"
#include "qwen_gsm8k/model/model.hpp"
#include "qwen_gsm8k/model/weights.hpp"
#include "support/shapes.hpp"

namespace dapo::bench {

struct RandomModel {
  qwen::Config config;
  qwen::Qwen2ForCausalLM model;
  int blas_threads = 1;  // what OpenBLAS was given (qwen::blas_threads_for the shape's width)
  int64_t parameters = 0;
};

// `threads` ATen threads, seed 0, the shape built, moved to `device` and filled there (quick on a GPU for a 1.5B
// model; on the CPU the fill follows the construction's draws, so the weights are those the benchmarks always drew).
inline RandomModel random_model(const std::string& shape, torch::Device device, int threads) {
  at::set_num_threads(threads);
  const qwen::Config config = model_shape(shape);
  const int blas_threads = qwen::set_blas_threads(qwen::blas_threads_for(config.hidden_size, threads));
  qwen::Qwen2ForCausalLM model = qwen::random_model(config, 0, device);
  int64_t parameters = 0;
  for (const auto& p : model->parameters()) parameters += p.numel();
  return {config, model, blas_threads, parameters};
}

}  // namespace dapo::bench
