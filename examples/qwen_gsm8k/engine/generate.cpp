// generate() through the engine: the prompts as requests, their sequences laid out as a padded batch.
#include "qwen_gsm8k/engine/generate.hpp"

#include <algorithm>

#include "qwen_gsm8k/engine/sequence_random.hpp"

namespace qwen {

EngineOptions engine_options(const GenerationOptions& options, int64_t max_num_seqs) {
  EngineOptions engine;
  engine.max_num_seqs = max_num_seqs;
  engine.max_new_tokens = options.max_new_tokens;
  engine.stop_ids = options.stop_ids;
  engine.sampling = options.sampling;
  engine.return_logprobs = options.return_logprobs;
  return engine;
}

GenerationOutput generate(Qwen2ForCausalLM& model, const std::vector<std::vector<int64_t>>& prompts,
                          const GenerationOptions& options, EngineStats* stats) {
  check_generation(model, prompts, options);
  const auto batch = static_cast<int64_t>(prompts.size());
  std::vector<EngineRequest> requests;
  for (int64_t b = 0; b < batch; ++b) {
    requests.push_back(
        {.prompt = prompts[static_cast<std::size_t>(b)], .n = 1, .seed = sequence_seed(options.seed, b)});
  }
  const auto sequences = generate_requests(model, requests, engine_options(options, batch), stats);

  const int64_t width = options.max_new_tokens;
  GenerationOutput out;
  out.tokens = torch::full({batch, width}, options.pad_id, torch::kInt64);
  out.lengths = torch::zeros({batch}, torch::kInt64);
  out.truncated = torch::zeros({batch}, torch::kBool);
  if (options.return_logprobs) out.logprobs = torch::zeros({batch, width}, torch::kFloat32);
  for (int64_t b = 0; b < batch; ++b) {
    const EngineSequence& sequence = sequences[static_cast<std::size_t>(b)].front();
    const auto length = static_cast<int64_t>(sequence.tokens.size());
    std::copy(sequence.tokens.begin(), sequence.tokens.end(), out.tokens[b].data_ptr<int64_t>());
    if (options.return_logprobs) {
      std::copy(sequence.logprobs.begin(), sequence.logprobs.end(), out.logprobs[b].data_ptr<float>());
    }
    out.lengths[b] = length;
    out.truncated[b] = sequence.finish_reason == FinishReason::kLength;
  }
  const torch::Device device = model->lm_head_weight().device();
  out.tokens = out.tokens.to(device);
  out.lengths = out.lengths.to(device);
  out.truncated = out.truncated.to(device);
  if (options.return_logprobs) out.logprobs = out.logprobs.to(device);
  return out;
}

}  // namespace qwen
