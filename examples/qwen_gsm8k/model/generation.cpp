// The decode loop: prefill once, then one token per step for the whole batch; finished rows keep emitting padding.
#include "qwen_gsm8k/model/generation.hpp"

#include "qwen_gsm8k/model/autocast.hpp"

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

namespace {

void check_prompts(const Qwen2ForCausalLM& model, const std::vector<std::vector<int64_t>>& prompts,
                   const GenerationOptions& options) {
  options.sampling.validate();
  if (prompts.empty()) throw std::invalid_argument("generate: no prompts");
  if (options.max_new_tokens <= 0) {
    throw std::invalid_argument("generate: max_new_tokens is " + std::to_string(options.max_new_tokens) +
                                ", expected > 0");
  }
  const int64_t vocab = model->config().vocab_size;
  // The pad id fills the model's input left of each prompt (masked, as transformers feeds it), so it must be a token.
  if (options.pad_id < 0 || options.pad_id >= vocab) {
    throw std::invalid_argument("generate: pad_id " + std::to_string(options.pad_id) +
                                " is outside the vocabulary [0, " + std::to_string(vocab) +
                                ") (a tokenizer's pad token past a small model's embedding? pass a token id)");
  }
  for (std::size_t b = 0; b < prompts.size(); ++b) {
    if (prompts[b].empty()) throw std::invalid_argument("generate: prompt " + std::to_string(b) + " is empty");
    for (const int64_t id : prompts[b]) {
      if (id < 0 || id >= vocab) {
        throw std::invalid_argument("generate: prompt " + std::to_string(b) + " holds token " + std::to_string(id) +
                                    ", outside the vocabulary [0, " + std::to_string(vocab) + ")");
      }
    }
  }
}

}  // namespace

GenerationOutput generate(Qwen2ForCausalLM& model, const std::vector<std::vector<int64_t>>& prompts,
                          const GenerationOptions& options) {
  check_prompts(model, prompts, options);
  torch::NoGradGuard no_grad;
  const torch::Tensor weights = model->lm_head_weight();
  const auto device = weights.device();
  const auto [prompt_ids, prompt_mask] = left_pad(prompts, options.pad_id, device);
  const int64_t batch = prompt_ids.size(0), width = prompt_ids.size(1), new_tokens = options.max_new_tokens;
  // The prompts and every new token in one buffer, written in place (column width + s holds new token s), and its
  // attention mask; the model sees the columns so far. A new token's position: its row's prompt length + s.
  const torch::Tensor sequence = torch::full({batch, width + new_tokens}, options.pad_id, prompt_ids.options());
  const torch::Tensor mask = torch::ones({batch, width + new_tokens}, prompt_mask.options());
  sequence.narrow(1, 0, width).copy_(prompt_ids);
  mask.narrow(1, 0, width).copy_(prompt_mask);
  const torch::Tensor first_position = prompt_mask.sum(1, /*keepdim=*/true);  // [B, 1]

  at::Generator generator = at::globalContext().defaultGenerator(device).clone();
  generator.set_current_seed(options.seed);
  std::unique_ptr<KVCache> cache;
  if (options.use_cache) {
    // Keys and values in the dtype the projections produce: autocast's (bfloat16 over float32 master weights: half the
    // cache) when it is on, else the weights'.
    const auto cache_dtype = active_autocast_dtype(device).value_or(weights.scalar_type());
    cache = std::make_unique<KVCache>(model->config(), batch, width + new_tokens, weights.options().dtype(cache_dtype));
  }
  const torch::Tensor stop_ids = torch::tensor(options.stop_ids.empty() ? std::vector<int64_t>{-1} : options.stop_ids,
                                               torch::TensorOptions().dtype(torch::kInt64).device(device));
  const double logprob_temperature = options.sampling.greedy() ? 1.0 : options.sampling.temperature;

  GenerationOutput out;
  out.tokens =
      torch::full({batch, new_tokens}, options.pad_id, torch::TensorOptions().dtype(torch::kInt64).device(device));
  if (options.return_logprobs) {
    out.logprobs = torch::zeros({batch, new_tokens}, weights.options().dtype(torch::kFloat32));
  }
  out.lengths = torch::zeros({batch}, torch::TensorOptions().dtype(torch::kInt64).device(device));
  torch::Tensor finished = torch::zeros({batch}, torch::TensorOptions().dtype(torch::kBool).device(device));

  // Prefill: the whole (padded) prompt; then the new token only with the cache, or everything again without it.
  torch::Tensor logits = model->last_logits(prompt_ids, prompt_mask, position_ids_from_mask(prompt_mask), cache.get());
  for (int64_t step = 0; step < new_tokens; ++step) {
    const torch::Tensor scores = process_logits(logits, sequence.narrow(1, 0, width + step), options.sampling);
    torch::Tensor next = select_tokens(scores, options.sampling, generator).masked_fill(finished, options.pad_id);
    if (options.return_logprobs) {
      const torch::Tensor logprob =
          (logits.to(torch::kFloat32) / logprob_temperature).log_softmax(-1).gather(1, next.unsqueeze(1)).squeeze(1);
      out.logprobs.select(1, step).copy_(logprob.masked_fill(finished, 0.0));
    }
    out.tokens.select(1, step).copy_(next);
    out.lengths += (~finished).to(torch::kInt64);
    finished = finished | (next.unsqueeze(1) == stop_ids.unsqueeze(0)).any(1);
    if (finished.all().item<bool>() || step + 1 == new_tokens) break;

    sequence.select(1, width + step).copy_(next);
    const torch::Tensor visible = mask.narrow(1, 0, width + step + 1);
    if (cache) {
      logits = model->last_logits(next.unsqueeze(1), visible, first_position + step, cache.get());
    } else {
      logits = model->last_logits(sequence.narrow(1, 0, width + step + 1), visible, position_ids_from_mask(visible));
    }
  }
  out.truncated = ~finished;
  return out;
}

}  // namespace qwen
