// Sampling and scoring groups of responses.
#include "qwen_gsm8k/rollout.hpp"

#include <chrono>

#include "qwen_gsm8k/chat.hpp"

namespace qwen {

std::vector<int64_t> prompt_ids(const Tokenizer& tokenizer, const std::string& system_prompt,
                                const std::string& question) {
  const std::string text = render_chat({{"system", system_prompt}, {"user", question}}, /*add_generation_prompt=*/true);
  const std::vector<int32_t> ids = tokenizer.encode(text);
  return std::vector<int64_t>(ids.begin(), ids.end());
}

std::vector<Group> rollout(Qwen2ForCausalLM& model, const Tokenizer& tokenizer, const std::vector<Problem>& problems,
                           const RolloutOptions& options, uint64_t seed, RolloutStats* stats) {
  const auto started = std::chrono::steady_clock::now();
  std::vector<Group> groups(problems.size());
  std::vector<std::vector<int64_t>> prompts;
  for (std::size_t g = 0; g < problems.size(); ++g) {
    groups[g].problem = problems[g];
    groups[g].prompt = prompt_ids(tokenizer, options.system_prompt, problems[g].question);
    for (int64_t i = 0; i < options.group_size; ++i) prompts.push_back(groups[g].prompt);
  }
  const auto rows = static_cast<int64_t>(prompts.size());
  const int64_t chunk = options.max_batch_rows > 0 ? options.max_batch_rows : rows;
  int64_t generated = 0;
  for (int64_t start = 0; start < rows; start += chunk) {
    const int64_t count = std::min(chunk, rows - start);
    GenerationOptions generation = options.generation;
    generation.seed = seed + static_cast<uint64_t>(start);  // each chunk its own stream, fixed by the seed
    const std::vector<std::vector<int64_t>> batch(prompts.begin() + start, prompts.begin() + start + count);
    const GenerationOutput out = generate(model, batch, generation);
    const torch::Tensor tokens = out.tokens.cpu(), lengths = out.lengths.cpu(), truncated = out.truncated.cpu();
    for (int64_t i = 0; i < count; ++i) {
      const int64_t row = start + i;
      Response response;
      const int64_t length = lengths[i].item<int64_t>();
      response.ids.assign(tokens[i].data_ptr<int64_t>(), tokens[i].data_ptr<int64_t>() + length);
      response.truncated = truncated[i].item<bool>();
      const std::vector<int32_t> ids32(response.ids.begin(), response.ids.end());
      response.text = tokenizer.decode(ids32, /*skip_special_tokens=*/true);
      auto& group = groups[static_cast<std::size_t>(row / options.group_size)];
      response.score = score_response(response.text, group.problem.reference, length, options.rewards);
      generated += length;
      group.responses.push_back(std::move(response));
    }
  }
  if (stats != nullptr) {
    stats->generated_tokens += generated;
    stats->seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  }
  return groups;
}

double greedy_accuracy(Qwen2ForCausalLM& model, const Tokenizer& tokenizer, const std::vector<Problem>& problems,
                       const RolloutOptions& options) {
  if (problems.empty()) return 0.0;
  torch::NoGradGuard no_grad;
  RolloutOptions greedy = options;
  greedy.group_size = 1;
  greedy.generation.sampling = {.temperature = 0.0};
  double correct = 0;
  for (const auto& group : rollout(model, tokenizer, problems, greedy, 0)) correct += group.responses[0].score.correct;
  return correct / static_cast<double>(problems.size());
}

}  // namespace qwen
