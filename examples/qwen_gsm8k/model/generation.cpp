// The decode loop: prefill once, then one token per step for the whole batch; finished rows keep emitting padding.
#include "qwen_gsm8k/model/generation.hpp"

#include <stdexcept>
#include <string>

namespace qwen {

std::pair<torch::Tensor, torch::Tensor> left_pad(const std::vector<std::vector<int64_t>>& prompts, int64_t pad_id,
                                                 torch::Device device) {
  int64_t longest = 0;
  for (const auto& prompt : prompts) longest = std::max<int64_t>(longest, static_cast<int64_t>(prompt.size()));
  const auto batch = static_cast<int64_t>(prompts.size());
  torch::Tensor ids = torch::full({batch, longest}, pad_id, torch::kInt64);
  torch::Tensor mask = torch::zeros({batch, longest}, torch::kInt64);
  for (int64_t b = 0; b < batch; ++b) {
    const auto& prompt = prompts[static_cast<std::size_t>(b)];
    const auto length = static_cast<int64_t>(prompt.size());
    if (length == 0) continue;
    ids[b].narrow(0, longest - length, length).copy_(torch::tensor(prompt, torch::kInt64));
    mask[b].narrow(0, longest - length, length).fill_(1);
  }
  return {ids.to(device), mask.to(device)};
}

GenerationOutput generate(Qwen2ForCausalLM& model, const std::vector<std::vector<int64_t>>& prompts,
                          const GenerationOptions& options) {
  options.sampling.validate();
  if (prompts.empty()) throw std::invalid_argument("generate: no prompts");
  if (options.max_new_tokens <= 0) {
    throw std::invalid_argument("generate: max_new_tokens is " + std::to_string(options.max_new_tokens) +
                                ", expected > 0");
  }
  const int64_t vocab = model->config().vocab_size;
  for (std::size_t b = 0; b < prompts.size(); ++b) {
    if (prompts[b].empty()) throw std::invalid_argument("generate: prompt " + std::to_string(b) + " is empty");
    for (const int64_t id : prompts[b]) {
      if (id < 0 || id >= vocab) {
        throw std::invalid_argument("generate: prompt " + std::to_string(b) + " holds token " + std::to_string(id) +
                                    ", outside the vocabulary [0, " + std::to_string(vocab) + ")");
      }
    }
  }
  torch::NoGradGuard no_grad;
  const torch::Tensor weights = model->lm_head_weight();
  const auto device = weights.device();
  auto [sequence, mask] = left_pad(prompts, options.pad_id, device);  // grow by one column per step
  const int64_t batch = sequence.size(0), new_tokens = options.max_new_tokens;

  at::Generator generator = at::globalContext().defaultGenerator(device).clone();
  generator.set_current_seed(options.seed);
  std::unique_ptr<KVCache> cache;
  if (options.use_cache) {
    cache = std::make_unique<KVCache>(model->config(), batch, sequence.size(1) + new_tokens, weights.options());
  }
  const torch::Tensor stop_ids = torch::tensor(options.stop_ids.empty() ? std::vector<int64_t>{-1} : options.stop_ids,
                                               torch::TensorOptions().dtype(torch::kInt64).device(device));
  const double logprob_temperature = options.sampling.greedy() ? 1.0 : options.sampling.temperature;

  GenerationOutput out;
  out.tokens =
      torch::full({batch, new_tokens}, options.pad_id, torch::TensorOptions().dtype(torch::kInt64).device(device));
  out.logprobs = torch::zeros({batch, new_tokens}, torch::TensorOptions().dtype(torch::kFloat32).device(device));
  out.lengths = torch::zeros({batch}, torch::TensorOptions().dtype(torch::kInt64).device(device));
  torch::Tensor finished = torch::zeros({batch}, torch::TensorOptions().dtype(torch::kBool).device(device));

  // Prefill: the whole (padded) prompt; then the new token only with the cache, or everything again without it.
  torch::Tensor logits = model->forward(sequence, mask, position_ids_from_mask(mask), cache.get()).select(1, -1);
  for (int64_t step = 0; step < new_tokens; ++step) {
    const torch::Tensor scores = process_logits(logits, sequence, options.sampling);
    torch::Tensor next = select_tokens(scores, options.sampling, generator);
    const torch::Tensor logprob =
        (logits.to(torch::kFloat32) / logprob_temperature).log_softmax(-1).gather(1, next.unsqueeze(1)).squeeze(1);
    next = next.masked_fill(finished, options.pad_id);
    out.tokens.select(1, step).copy_(next);
    out.logprobs.select(1, step).copy_(logprob.masked_fill(finished, 0.0));
    out.lengths += (~finished).to(torch::kInt64);
    finished = finished | (next.unsqueeze(1) == stop_ids.unsqueeze(0)).any(1);
    if (finished.all().item<bool>() || step + 1 == new_tokens) break;

    sequence = torch::cat({sequence, next.unsqueeze(1)}, 1);
    mask = torch::cat({mask, torch::ones({batch, 1}, mask.options())}, 1);
    if (cache) {
      const torch::Tensor position = position_ids_from_mask(mask).narrow(1, mask.size(1) - 1, 1);
      logits = model->forward(next.unsqueeze(1), mask, position, cache.get()).select(1, -1);
    } else {
      logits = model->forward(sequence, mask, position_ids_from_mask(mask), nullptr).select(1, -1);
    }
  }
  out.truncated = ~finished;
  return out;
}

}  // namespace qwen
