// The reference decoder: every step recomputes the whole left-padded batch; finished rows keep emitting padding.
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

void check_generation(const Qwen2ForCausalLM& model, const std::vector<std::vector<int64_t>>& prompts,
                      const GenerationOptions& options) {
  options.sampling.validate();
  if (prompts.empty()) throw std::invalid_argument("generate: no prompts");
  if (options.max_new_tokens <= 0) {
    throw std::invalid_argument("generate: max_new_tokens is " + std::to_string(options.max_new_tokens) +
                                ", expected > 0");
  }
  const int64_t vocab = model->config().vocab_size;
  // The pad id fills the output after a sequence's end (and the reference's input left of each prompt, masked, as
  // transformers feeds it), so it must be a token.
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

GenerationOutput reference_generate(Qwen2ForCausalLM& model, const std::vector<std::vector<int64_t>>& prompts,
                                    const GenerationOptions& options) {
  check_generation(model, prompts, options);
  if (!options.sampling.greedy()) {
    throw std::invalid_argument("reference_generate: temperature is " + std::to_string(options.sampling.temperature) +
                                ", expected 0 (the reference decodes greedily)");
  }
  torch::NoGradGuard no_grad;
  const auto device = model->lm_head_weight().device();
  const auto [prompt_ids, prompt_mask] = left_pad(prompts, options.pad_id, device);
  const int64_t batch = prompt_ids.size(0), width = prompt_ids.size(1), new_tokens = options.max_new_tokens;
  // The prompts and every new token in one buffer (column width + s holds new token s) and its attention mask; the
  // model sees the columns so far.
  const auto longs = torch::TensorOptions().dtype(torch::kInt64).device(device);
  const torch::Tensor sequence = torch::full({batch, width + new_tokens}, options.pad_id, longs);
  const torch::Tensor mask = torch::ones({batch, width + new_tokens}, longs);
  sequence.narrow(1, 0, width).copy_(prompt_ids);
  mask.narrow(1, 0, width).copy_(prompt_mask);
  const torch::Tensor stop_ids =
      torch::tensor(options.stop_ids.empty() ? std::vector<int64_t>{-1} : options.stop_ids, longs);

  GenerationOutput out;
  out.tokens = torch::full({batch, new_tokens}, options.pad_id, longs);
  if (options.return_logprobs) out.logprobs = torch::zeros({batch, new_tokens}, longs.dtype(torch::kFloat32));
  out.lengths = torch::zeros({batch}, longs);
  torch::Tensor finished = torch::zeros({batch}, longs.dtype(torch::kBool));
  for (int64_t step = 0; step < new_tokens; ++step) {
    const torch::Tensor visible = mask.narrow(1, 0, width + step), seen = sequence.narrow(1, 0, width + step);
    const torch::Tensor logits = model->last_logits(seen, visible, position_ids_from_mask(visible)).to(torch::kFloat32);
    const torch::Tensor next =
        process_logits(logits, seen, options.sampling).argmax(-1).masked_fill(finished, options.pad_id);
    if (options.return_logprobs) {
      const torch::Tensor logprob = logits.log_softmax(-1).gather(1, next.unsqueeze(1)).squeeze(1);
      out.logprobs.select(1, step).copy_(logprob.masked_fill(finished, 0.0));
    }
    out.tokens.select(1, step).copy_(next);
    out.lengths += (~finished).to(torch::kInt64);
    finished = finished | (next.unsqueeze(1) == stop_ids.unsqueeze(0)).any(1);
    if (finished.all().item<bool>()) break;
    sequence.select(1, width + step).copy_(next);
  }
  out.truncated = ~finished;
  return out;
}

}  // namespace qwen
