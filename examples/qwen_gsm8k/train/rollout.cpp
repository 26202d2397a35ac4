// Sampling and scoring groups of responses.
#include "qwen_gsm8k/train/rollout.hpp"

#include <algorithm>
#include <chrono>
#include <stdexcept>

#include "qwen_gsm8k/common/seed.hpp"
#include "qwen_gsm8k/engine/generate.hpp"
#include "qwen_gsm8k/text/chat.hpp"

namespace qwen {

std::vector<int64_t> prompt_ids(const Tokenizer& tokenizer, const std::string& system_prompt,
                                const std::string& question) {
  const std::string text = render_chat({{"system", system_prompt}, {"user", question}}, /*add_generation_prompt=*/true);
  const std::vector<int32_t> ids = tokenizer.encode(text);
  return std::vector<int64_t>(ids.begin(), ids.end());
}

void RolloutStats::add(const EngineStats& engine) {
  generated_tokens += engine.useful_tokens;
  decode_calls += engine.decode_calls;
  rows_computed += engine.rows_computed;
  prefill_rows += engine.prefill_rows;
  sequences += engine.sequences;
  prefill_calls += engine.prefill_calls;
  checks += engine.checks;
  graph_captures += engine.graph_captures;
  graph_replays += engine.graph_replays;
  host_reads += engine.host_reads;
  host_fetches += engine.host_fetches;
  host_copies += engine.host_copies;
}

EngineOptions rollout_engine_options(const RolloutOptions& options, int64_t rows, int64_t max_prompt_tokens) {
  EngineOptions engine =
      engine_options(options.generation, options.max_batch_rows > 0 ? std::min(options.max_batch_rows, rows) : rows);
  engine.max_prompt_tokens = max_prompt_tokens;
  engine.check_every = options.check_every;
  engine.cuda_graphs = options.cuda_graphs;
  return engine;
}

uint64_t request_seed(uint64_t seed, int64_t index) {
  return splitmix64(seed ^ (kSplitMixMultiplier2 * static_cast<uint64_t>(index + 1)));
}

std::string response_text(const Tokenizer& tokenizer, const std::vector<int64_t>& ids) {
  std::vector<int32_t> known;
  known.reserve(ids.size());
  for (const int64_t id : ids) {
    if (id < tokenizer.vocab_size()) known.push_back(static_cast<int32_t>(id));
  }
  return tokenizer.decode(known, /*skip_special_tokens=*/true);
}

int64_t longest_prompt_tokens(const Tokenizer& tokenizer, const std::string& system_prompt,
                              const std::vector<Problem>& problems) {
  int64_t longest = 0;
  for (const auto& problem : problems) {
    longest = std::max(longest, static_cast<int64_t>(prompt_ids(tokenizer, system_prompt, problem.question).size()));
  }
  return longest;
}

Response make_response(const Tokenizer& tokenizer, EngineSequence&& sequence, const std::string& reference,
                       const RewardOptions& rewards) {
  Response response;
  response.ids = std::move(sequence.tokens);
  response.logprobs = std::move(sequence.logprobs);
  response.truncated = sequence.finish_reason == FinishReason::kLength;
  response.text = response_text(tokenizer, response.ids);  // padding ids have no text but stay in ids for the loss
  response.score = score_response(response.text, reference, static_cast<int64_t>(response.ids.size()), rewards);
  return response;
}

std::vector<Group> rollout(Qwen2ForCausalLM& model, const Tokenizer& tokenizer, const std::vector<Problem>& problems,
                           const RolloutOptions& options, uint64_t seed, RolloutStats* stats,
                           const ChunkProgress& on_chunk) {
  if (problems.empty()) return {};
  const auto rows = static_cast<int64_t>(problems.size()) * options.group_size;
  const int64_t longest = longest_prompt_tokens(tokenizer, options.system_prompt, problems);
  GenerationEngine engine(model, rollout_engine_options(options, rows, longest));
  return rollout(engine, tokenizer, problems, options, seed, stats, on_chunk);
}

std::vector<Group> rollout(GenerationEngine& engine, const Tokenizer& tokenizer, const std::vector<Problem>& problems,
                           const RolloutOptions& options, uint64_t seed, RolloutStats* stats,
                           const ChunkProgress& on_chunk) {
  const EngineOptions& engine_options = engine.options();
  if (engine_options.max_new_tokens != options.generation.max_new_tokens ||
      engine_options.stop_ids != options.generation.stop_ids) {
    throw std::logic_error("rollout: the engine was made for another max_new_tokens or other stop ids");
  }
  const auto started = std::chrono::steady_clock::now();
  std::vector<Group> groups(problems.size());
  for (std::size_t g = 0; g < problems.size(); ++g) {
    groups[g].problem = problems[g];
    groups[g].prompt = prompt_ids(tokenizer, options.system_prompt, problems[g].question);
    groups[g].responses.resize(static_cast<std::size_t>(options.group_size));
  }
  if (groups.empty()) return groups;
  const auto rows = static_cast<int64_t>(groups.size()) * options.group_size;
  const int64_t report_every = std::min(engine.options().max_num_seqs, rows);
  int64_t done = 0;
  std::size_t next = 0;
  const EngineStats counts = engine.run(
      [&]() -> std::optional<EngineRequest> {
        if (next == groups.size()) return std::nullopt;
        const std::size_t g = next++;
        return EngineRequest{
            .prompt = groups[g].prompt, .n = options.group_size, .seed = request_seed(seed, static_cast<int64_t>(g))};
      },
      [&](EngineSequence&& sequence) {
        Group& group = groups[static_cast<std::size_t>(sequence.request)];
        const auto sample = static_cast<std::size_t>(sequence.sample);
        group.responses[sample] =
            make_response(tokenizer, std::move(sequence), group.problem.reference, options.rewards);
        ++done;
        if (on_chunk && (done % report_every == 0 || done == rows)) on_chunk(done, rows);
        return true;
      },
      {.sampling = options.generation.sampling, .return_logprobs = options.generation.return_logprobs});
  if (stats != nullptr) {
    stats->add(counts);
    stats->seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  }
  return groups;
}

namespace {

RolloutOptions greedy_options(const RolloutOptions& options) {
  RolloutOptions greedy = options;
  greedy.group_size = 1;
  greedy.generation.sampling = {.temperature = 0.0};
  greedy.generation.return_logprobs = false;
  return greedy;
}

int64_t count_correct(const std::vector<Group>& groups) {
  int64_t correct = 0;
  for (const auto& group : groups) correct += group.responses[0].score.correct;
  return correct;
}

}  // namespace

int64_t greedy_correct(Qwen2ForCausalLM& model, const Tokenizer& tokenizer, const std::vector<Problem>& problems,
                       const RolloutOptions& options, const ChunkProgress& on_chunk) {
  if (problems.empty()) return 0;
  torch::NoGradGuard no_grad;
  return count_correct(rollout(model, tokenizer, problems, greedy_options(options), 0, nullptr, on_chunk));
}

int64_t greedy_correct(GenerationEngine& engine, const Tokenizer& tokenizer, const std::vector<Problem>& problems,
                       const RolloutOptions& options, const ChunkProgress& on_chunk) {
  if (problems.empty()) return 0;
  torch::NoGradGuard no_grad;
  return count_correct(rollout(engine, tokenizer, problems, greedy_options(options), 0, nullptr, on_chunk));
}

namespace {

class Writer {
 public:
  void number(double value) { out_.push_back(value); }
  void text(const std::string& value) {
    number(static_cast<double>(value.size()));
    for (const char c : value) number(static_cast<double>(static_cast<unsigned char>(c)));
  }
  void ids(const std::vector<int64_t>& value) {
    number(static_cast<double>(value.size()));
    for (const int64_t id : value) number(static_cast<double>(id));
  }
  void floats(const std::vector<float>& value) {  // every float is exact in a double
    number(static_cast<double>(value.size()));
    for (const float x : value) number(static_cast<double>(x));
  }
  std::vector<double> take() { return std::move(out_); }

 private:
  std::vector<double> out_;
};

class Reader {
 public:
  Reader(const double* values, std::size_t count) : values_(values), count_(count) {}
  double number() {
    if (position_ >= count_)
      throw std::runtime_error("decode_groups: the encoded groups end early (truncated message)");
    return values_[position_++];
  }
  int64_t integer() { return static_cast<int64_t>(number()); }
  std::size_t size() {
    const int64_t value = integer();
    if (value < 0 || static_cast<std::size_t>(value) > count_ - position_) {
      throw std::runtime_error("decode_groups: a length of " + std::to_string(value) + " at value " +
                               std::to_string(position_) + " exceeds the message");
    }
    return static_cast<std::size_t>(value);
  }
  std::string text() {
    std::string value(size(), '\0');
    for (auto& c : value) c = static_cast<char>(static_cast<unsigned char>(integer()));
    return value;
  }
  std::vector<int64_t> ids() {
    std::vector<int64_t> value(size());
    for (auto& id : value) id = integer();
    return value;
  }
  std::vector<float> floats() {
    std::vector<float> value(size());
    for (auto& x : value) x = static_cast<float>(number());
    return value;
  }
  bool done() const { return position_ == count_; }

 private:
  const double* values_;
  std::size_t count_, position_ = 0;
};

}  // namespace

std::vector<double> encode_groups(const std::vector<Group>& groups) {
  Writer out;
  out.number(static_cast<double>(groups.size()));
  for (const auto& group : groups) {
    out.text(group.problem.question);
    out.text(group.problem.reference);
    out.number(group.problem.arithmetic.has_value());
    if (const auto& arithmetic = group.problem.arithmetic) {
      out.number(static_cast<double>(arithmetic->left));
      out.number(arithmetic->operation == Arithmetic::Operation::kAdd ? 0 : 1);
      out.number(static_cast<double>(arithmetic->right));
    }
    out.ids(group.prompt);
    out.number(static_cast<double>(group.responses.size()));
    for (const auto& response : group.responses) {
      out.ids(response.ids);
      out.text(response.text);
      out.number(response.truncated);
      const ResponseScore& score = response.score;
      for (const double value : {score.parts.correctness, score.parts.digit, score.parts.hard_format, score.parts.mark,
                                 score.overlong, score.total}) {
        out.number(value);
      }
      out.number(score.correct);
      out.floats(response.logprobs);
    }
  }
  return out.take();
}

std::vector<Group> decode_groups(const double* values, std::size_t count) {
  Reader in(values, count);
  std::vector<Group> groups(in.size());
  for (auto& group : groups) {
    group.problem.question = in.text();
    group.problem.reference = in.text();
    if (in.integer() != 0) {
      Arithmetic arithmetic;
      arithmetic.left = in.integer();
      arithmetic.operation = in.integer() == 0 ? Arithmetic::Operation::kAdd : Arithmetic::Operation::kSubtract;
      arithmetic.right = in.integer();
      group.problem.arithmetic = arithmetic;
    }
    group.prompt = in.ids();
    group.responses.resize(in.size());
    for (auto& response : group.responses) {
      response.ids = in.ids();
      response.text = in.text();
      response.truncated = in.integer() != 0;
      ResponseScore& score = response.score;
      score.parts.correctness = in.number();
      score.parts.digit = in.number();
      score.parts.hard_format = in.number();
      score.parts.mark = in.number();
      score.overlong = in.number();
      score.total = in.number();
      score.correct = in.integer() != 0;
      response.logprobs = in.floats();
    }
  }
  if (!in.done())
    throw std::runtime_error("decode_groups: " + std::to_string(count) + " values hold more than the groups");
  return groups;
}

}  // namespace qwen
