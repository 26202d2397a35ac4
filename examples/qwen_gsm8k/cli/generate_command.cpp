// `qwen_gsm8k generate`: JSON lines of prompts in, JSON lines of completions out, through the generation engine (vLLM's
// offline LLM.generate, verl's main_generation). Every input line is read and checked before any generation, so a bad
// line costs nothing; an output line is written and flushed as soon as it and every line before it are done.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <stdexcept>

#include <dapo/rewards/gsm8k.hpp>

#include "qwen_gsm8k/cli/commands.hpp"
#include "qwen_gsm8k/cli/options.hpp"
#include "qwen_gsm8k/engine/engine.hpp"
#include "qwen_gsm8k/model/autocast.hpp"
#include "qwen_gsm8k/model/device_check.hpp"
#include "qwen_gsm8k/model/weights.hpp"
#include "qwen_gsm8k/text/chat.hpp"
#include "qwen_gsm8k/text/tokenizer.hpp"
#include "qwen_gsm8k/train/rewards.hpp"
#include "qwen_gsm8k/train/rollout.hpp"

namespace qwen::cli {

void add_generate_command(CLI::App& app, GenerateCommand& command) {
  CLI::App* sub = app.add_subcommand(
      "generate",
      "Completions of JSON-lines prompts ({\"prompt\": text}, {\"messages\": [...]}, {\"question\": text} with "
      "training's system prompt, or {\"prompt_token_ids\": [...]}; an \"answer\" adds the rewards), one JSON line "
      "out per line in, in input order");
  GenerateOptions& o = command.options;
  sub->add_option("--model", command.model_dir, "Model directory: config.json, safetensors, tokenizer.json")
      ->required()
      ->check(CLI::ExistingDirectory);
  sub->add_option("--input", command.input, "JSON lines of prompts")->required()->check(CLI::ExistingFile);
  sub->add_option("--output", command.output, "JSON lines of completions (replaced)")->required();
  sub->add_option("--n", o.n, "Completions per prompt")->capture_default_str()->check(positive());
  sub->add_option("--temperature", o.sampling.temperature, "0 = greedy")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--top-k", o.sampling.top_k, "0 = off")->capture_default_str()->check(CLI::NonNegativeNumber);
  sub->add_option("--top-p", o.sampling.top_p, "1 = off")->capture_default_str()->check(CLI::Range(0.0, 1.0));
  sub->add_option("--seed", o.seed, "Line i's sample j draws from a generator seeded by (seed, i, j)")
      ->capture_default_str();
  sub->add_option("--max-new-tokens", o.max_new_tokens, "The length budget")->capture_default_str()->check(positive());
  sub->add_option("--max-num-seqs", o.max_num_seqs, "Sequence slots (vLLM's max_num_seqs)")
      ->capture_default_str()
      ->check(positive());
  add_switch(*sub, "--cuda-graphs,!--no-cuda-graphs", o.cuda_graphs,
             "On CUDA, run each decode step as a CUDA graph (vLLM's default; --no-cuda-graphs: its enforce_eager)");
  sub->add_flag("--logprobs", o.logprobs, "Write each token's log-prob under softmax(logits / temperature)");
  sub->add_flag("--skip-bad-lines", o.skip_bad_lines,
                "Skip (and count) malformed input lines instead of stopping at the first");
  sub->add_option("--device", command.device, "cpu, cuda or cuda:N")->capture_default_str();
  sub->add_option("--dtype", command.dtype, "float32 or bfloat16 weights")->capture_default_str();
  command.app = sub;
}

namespace {

std::string where(const std::string& file, int64_t line) {
  return file + ":" + std::to_string(line) + ": ";
}

// One input line as a request; throws std::invalid_argument naming what is wrong.
GenerateLine parse_line(const nlohmann::json& item, const Tokenizer& tokenizer, const GenerateOptions& options) {
  if (!item.is_object()) throw std::invalid_argument("expected a JSON object");
  GenerateLine line;
  int fields = 0;
  const auto encode = [&](const std::string& text) {
    const std::vector<int32_t> ids = tokenizer.encode(text);
    line.prompt.assign(ids.begin(), ids.end());
  };
  if (item.contains("prompt")) {
    ++fields;
    if (!item["prompt"].is_string()) throw std::invalid_argument("\"prompt\" is not a string");
    encode(item["prompt"].get<std::string>());
  }
  if (item.contains("messages")) {
    ++fields;
    const auto& messages = item["messages"];
    if (!messages.is_array() || messages.empty()) throw std::invalid_argument("\"messages\" is not a non-empty array");
    std::vector<ChatMessage> chat;
    for (const auto& message : messages) {
      if (!message.is_object() || !message.contains("role") || !message.contains("content") ||
          !message["role"].is_string() || !message["content"].is_string()) {
        throw std::invalid_argument("a message is not {\"role\": text, \"content\": text}");
      }
      chat.push_back({message["role"].get<std::string>(), message["content"].get<std::string>()});
    }
    encode(render_chat(chat, /*add_generation_prompt=*/true));
  }
  if (item.contains("question")) {
    ++fields;
    if (!item["question"].is_string()) throw std::invalid_argument("\"question\" is not a string");
    line.prompt = prompt_ids(tokenizer, options.system_prompt, item["question"].get<std::string>());
  }
  if (item.contains("prompt_token_ids")) {
    ++fields;
    const auto& ids = item["prompt_token_ids"];
    if (!ids.is_array()) throw std::invalid_argument("\"prompt_token_ids\" is not an array");
    for (const auto& id : ids) {
      if (!id.is_number_integer()) throw std::invalid_argument("\"prompt_token_ids\" holds a non-integer");
      line.prompt.push_back(id.get<int64_t>());
    }
  }
  if (fields != 1) {
    throw std::invalid_argument("expected exactly one of \"prompt\", \"messages\", \"question\", \"prompt_token_ids\"");
  }
  if (line.prompt.empty()) throw std::invalid_argument("the prompt has no tokens");
  if (item.contains("answer")) {
    if (!item["answer"].is_string()) throw std::invalid_argument("\"answer\" is not a string");
    // GSM8K's whole answer field ("... #### 72") or the answer alone ("72").
    const std::string answer = item["answer"].get<std::string>();
    line.answer = answer.find("####") != std::string::npos ? dapo::gsm8k::reference_answer(answer) : answer;
  }
  return line;
}

}  // namespace

std::vector<GenerateLine> read_generate_input(std::istream& in, const std::string& name, const Tokenizer& tokenizer,
                                              const GenerateOptions& options, int64_t* skipped) {
  std::vector<GenerateLine> lines;
  std::string text;
  for (int64_t number = 1; std::getline(in, text); ++number) {
    if (!text.empty() && text.back() == '\r') text.pop_back();
    if (text.find_first_not_of(" \t") == std::string::npos) continue;
    try {
      const auto item = nlohmann::json::parse(text);
      GenerateLine line = parse_line(item, tokenizer, options);
      line.line = number;
      lines.push_back(std::move(line));
    } catch (const std::exception& error) {
      if (!options.skip_bad_lines) throw std::invalid_argument(where(name, number) + error.what());
      if (skipped != nullptr) ++*skipped;
    }
  }
  return lines;
}

GenerateSummary generate_lines(Qwen2ForCausalLM& model, const Tokenizer& tokenizer,
                               const std::vector<GenerateLine>& lines, const GenerateOptions& options,
                               std::ostream& out, const std::function<void(int64_t, int64_t)>& progress) {
  EngineOptions engine;
  engine.max_num_seqs = options.max_num_seqs;
  engine.max_new_tokens = options.max_new_tokens;
  engine.sampling = options.sampling;
  engine.return_logprobs = options.logprobs;
  engine.cuda_graphs = options.cuda_graphs;
  for (const char* stop : {"<|im_end|>", "<|endoftext|>"}) {
    if (const auto id = tokenizer.token_to_id(stop)) engine.stop_ids.push_back(*id);
  }
  for (const auto& line : lines) {
    engine.max_prompt_tokens = std::max<int64_t>(engine.max_prompt_tokens, static_cast<int64_t>(line.prompt.size()));
  }
  GenerateSummary summary;
  summary.lines = static_cast<int64_t>(lines.size());
  if (lines.empty()) return summary;
  RewardOptions rewards;
  rewards.max_length = options.max_new_tokens;

  // Lines finish out of order; each is written once it and all before it are done.
  std::vector<std::vector<EngineSequence>> done(lines.size());
  std::size_t next_request = 0, next_written = 0;
  const auto write_ready = [&] {
    while (next_written < lines.size() && static_cast<int64_t>(done[next_written].size()) == options.n) {
      auto& sequences = done[next_written];
      std::sort(sequences.begin(), sequences.end(),
                [](const EngineSequence& a, const EngineSequence& b) { return a.sample < b.sample; });
      const GenerateLine& line = lines[next_written];
      nlohmann::json record{{"index", next_written}, {"line", line.line}, {"prompt_token_ids", line.prompt}};
      nlohmann::json outputs = nlohmann::json::array();
      for (const auto& sequence : sequences) {
        nlohmann::json output{{"text", response_text(tokenizer, sequence.tokens)},
                              {"token_ids", sequence.tokens},
                              {"finish_reason", finish_reason_name(sequence.finish_reason)}};
        if (options.logprobs) output["logprobs"] = sequence.logprobs;
        if (line.answer) {
          const ResponseScore score = score_response(output["text"].get<std::string>(), *line.answer,
                                                     static_cast<int64_t>(sequence.tokens.size()), rewards);
          output["reward"] = score.total;
          output["correct"] = score.correct;
          summary.correct += score.correct ? 1 : 0;
          ++summary.scored;
        }
        summary.tokens += static_cast<int64_t>(sequence.tokens.size());
        outputs.push_back(std::move(output));
      }
      record["outputs"] = std::move(outputs);
      out << record.dump() << "\n";
      out.flush();
      sequences.clear();
      ++next_written;
      if (progress) progress(static_cast<int64_t>(next_written), summary.lines);
    }
  };
  GenerationEngine runner(model, engine);
  runner.run(
      [&]() -> std::optional<EngineRequest> {
        if (next_request == lines.size()) return std::nullopt;
        const std::size_t index = next_request++;
        return EngineRequest{.prompt = lines[index].prompt,
                             .n = options.n,
                             .seed = options.seed ^ (0x9E3779B97F4A7C15ull * (static_cast<uint64_t>(index) + 1))};
      },
      [&](EngineSequence&& sequence) {
        done[static_cast<std::size_t>(sequence.request)].push_back(std::move(sequence));
        write_ready();
        return true;
      });
  return summary;
}

int run_generate_command(const GenerateCommand& command) {
  const torch::Device device = usable_device(command.device, "generate");  // before any work
  const Tokenizer tokenizer = Tokenizer::from_directory(command.model_dir);
  std::ifstream in(command.input);
  if (!in) throw std::runtime_error("cannot read --input " + command.input);
  int64_t skipped = 0;
  const auto lines = read_generate_input(in, command.input, tokenizer, command.options, &skipped);
  const auto dtype = command.dtype == "bfloat16" ? torch::kBFloat16 : torch::kFloat32;
  if (command.dtype != "float32" && command.dtype != "bfloat16") {
    throw std::invalid_argument("--dtype is '" + command.dtype + "', expected float32 or bfloat16");
  }
  auto model = load_model(command.model_dir, dtype, device);
  model->eval();
  std::ofstream out(command.output, std::ios::trunc);
  if (!out) throw std::runtime_error("cannot write --output " + command.output);
  const bool terminal = ::isatty(STDERR_FILENO) != 0;
  const auto started = std::chrono::steady_clock::now();
  const GenerateSummary summary =
      generate_lines(model, tokenizer, lines, command.options, out, [&](int64_t done, int64_t total) {
        if (!terminal) return;
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
        std::fprintf(stderr, "\rgenerate: %lld/%lld lines, %.0f s", static_cast<long long>(done),
                     static_cast<long long>(total), seconds);
        std::fflush(stderr);
      });
  if (terminal) std::fputc('\n', stderr);
  std::fprintf(stderr, "generate: %lld lines (%lld skipped), %lld tokens", static_cast<long long>(summary.lines),
               static_cast<long long>(skipped), static_cast<long long>(summary.tokens));
  if (summary.scored > 0) {
    std::fprintf(stderr, ", %lld of %lld correct", static_cast<long long>(summary.correct),
                 static_cast<long long>(summary.scored));
  }
  std::fprintf(stderr, " -> %s\n", command.output.c_str());
  return 0;
}

}  // namespace qwen::cli
