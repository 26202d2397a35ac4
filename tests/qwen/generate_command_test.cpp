// `qwen_gsm8k generate`'s reading and writing: every input form, lines out in input order (each written as soon as it
// and the lines before it are done), the engine's greedy tokens, rewards where an answer is given, bad lines named by
// file:line or skipped and counted.
#include <torch/torch.h>

#include <sstream>
#include <string>
#include <vector>

#include "qwen_gsm8k/cli/commands.hpp"
#include "qwen_gsm8k/engine/engine.hpp"
#include "qwen_gsm8k/model/weights.hpp"
#include "qwen_gsm8k/text/chat.hpp"
#include "support/qwen_fixtures.hpp"

namespace {

std::vector<nlohmann::json> lines_of(const std::string& text) {
  std::vector<nlohmann::json> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

}  // namespace

TEST_CASE("generate: JSON lines in, one line out per line in input order, the engine's tokens, flushed as done") {
  const auto model_dir = dapo::test::qwen_fixture("tiny-tied-f32");
  const auto shared = dapo::test::require_shared("fixtures/tokenizer/qwen2.5");
  if (!model_dir || !shared) return;
  const auto tokenizer = qwen::Tokenizer::from_directory(*shared / "fixtures" / "tokenizer" / "qwen2.5");
  auto model = qwen::load_model(*model_dir);
  qwen::cli::GenerateOptions options;
  options.n = 2;
  options.max_new_tokens = 6;
  options.max_num_seqs = 3;  // fewer slots than rows
  std::istringstream input(
      "{\"prompt_token_ids\": [5, 6, 7, 8, 9, 10, 11]}\n"
      "\n"
      "{\"prompt_token_ids\": [12], \"answer\": \"42\"}\n"
      "{\"prompt_token_ids\": [13, 14, 15]}\n");
  const auto lines = qwen::cli::read_generate_input(input, "in.jsonl", tokenizer, options);
  REQUIRE(lines.size() == 3);
  CHECK(lines[1].line == 3);
  CHECK(lines[1].answer == std::optional<std::string>("42"));

  std::ostringstream out;
  std::vector<std::size_t> written_when;  // output lines present at each progress call
  const auto summary = qwen::cli::generate_lines(model, tokenizer, lines, options, out, [&](int64_t done, int64_t) {
    written_when.push_back(lines_of(out.str()).size());
    CHECK(static_cast<int64_t>(written_when.back()) == done);
  });
  CHECK(written_when == std::vector<std::size_t>{1, 2, 3});
  const auto records = lines_of(out.str());
  REQUIRE(records.size() == 3);

  qwen::EngineOptions engine;
  engine.max_new_tokens = 6;
  engine.sampling.temperature = 0.0;
  std::vector<qwen::EngineRequest> requests;
  for (const auto& line : lines) requests.push_back({.prompt = line.prompt, .n = 1});
  const auto expected = qwen::generate_requests(model, requests, engine);
  for (std::size_t i = 0; i < 3; ++i) {
    CAPTURE(i);
    CHECK(records[i].at("index") == i);
    CHECK(records[i].at("line") == lines[i].line);
    REQUIRE(records[i].at("outputs").size() == 2);
    for (const auto& output : records[i].at("outputs")) {
      CHECK(output.at("token_ids").get<std::vector<int64_t>>() == expected[i][0].tokens);  // greedy: both samples
      CHECK(output.at("finish_reason") == "length");
      CHECK(output.contains("correct") == (i == 1));
    }
  }
  CHECK(summary.scored == 2);
  CHECK(summary.tokens == 3 * 2 * 6);
}

TEST_CASE("generate: text, chat and question lines are encoded as training encodes them") {
  const auto shared = dapo::test::require_shared("fixtures/tokenizer/qwen2.5");
  if (!shared) return;
  const auto tokenizer = qwen::Tokenizer::from_directory(*shared / "fixtures" / "tokenizer" / "qwen2.5");
  qwen::cli::GenerateOptions options;
  std::istringstream input(
      "{\"prompt\": \"Hello\"}\n"
      "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}]}\n"
      "{\"question\": \"What is 2 + 3?\"}\n");
  const auto lines = qwen::cli::read_generate_input(input, "in.jsonl", tokenizer, options);
  REQUIRE(lines.size() == 3);
  const auto ids = [&](const std::string& text) {
    const auto encoded = tokenizer.encode(text);
    return std::vector<int64_t>(encoded.begin(), encoded.end());
  };
  CHECK(lines[0].prompt == ids("Hello"));
  CHECK(lines[1].prompt == ids(qwen::render_chat({{"user", "Hi"}}, true)));
  CHECK(lines[2].prompt == qwen::prompt_ids(tokenizer, options.system_prompt, "What is 2 + 3?"));
}

TEST_CASE("generate: a malformed line is named by file:line, or skipped and counted with --skip-bad-lines") {
  const auto shared = dapo::test::require_shared("fixtures/tokenizer/qwen2.5");
  if (!shared) return;
  const auto tokenizer = qwen::Tokenizer::from_directory(*shared / "fixtures" / "tokenizer" / "qwen2.5");
  qwen::cli::GenerateOptions options;
  const std::string text =
      "{\"prompt\": \"fine\"}\n"
      "{\"prompt\": 3}\n"
      "not json\n"
      "{\"prompt\": \"a\", \"question\": \"b\"}\n"
      "{\"prompt_token_ids\": []}\n"
      "{\"prompt\": \"also fine\", \"answer\": 7}\n"
      "{\"prompt_token_ids\": [1, 2]}\n";
  std::istringstream first(text);
  CHECK_THROWS_WITH_AS(qwen::cli::read_generate_input(first, "in.jsonl", tokenizer, options),
                       doctest::Contains("in.jsonl:2: \"prompt\" is not a string"), std::invalid_argument);
  options.skip_bad_lines = true;
  std::istringstream second(text);
  int64_t skipped = 0;
  const auto lines = qwen::cli::read_generate_input(second, "in.jsonl", tokenizer, options, &skipped);
  CHECK(skipped == 5);
  REQUIRE(lines.size() == 2);
  CHECK(lines[0].line == 1);
  CHECK(lines[1].line == 7);
}

TEST_CASE("eval and generate on a model directory: training's greedy accuracy, GSM8K questions with answers") {
  const auto shared = dapo::test::require_shared("fixtures/tokenizer/qwen2.5", "data/gsm8k");
  if (!shared) return;
  dapo::test::ScratchDir scratch;
  const auto model_dir = scratch.path() / "model";
  torch::manual_seed(0);
  const nlohmann::json config{{"model_type", "qwen2"},       {"vocab_size", 151936},
                              {"hidden_size", 32},           {"intermediate_size", 64},
                              {"num_hidden_layers", 2},      {"num_attention_heads", 4},
                              {"num_key_value_heads", 2},    {"max_position_embeddings", 2048},
                              {"tie_word_embeddings", true}, {"eos_token_id", 151645}};
  {
    qwen::Qwen2ForCausalLM model(qwen::Config::from_json(config, "test"));
    qwen::initialize_weights(model);
    qwen::save_model(model, model_dir);
  }
  for (const char* file : {"tokenizer.json", "tokenizer_config.json"}) {
    std::filesystem::copy_file(*shared / "fixtures/tokenizer/qwen2.5" / file, model_dir / file);
  }
  qwen::cli::EvalCommand eval;
  eval.model_dir = model_dir.string();
  eval.test_file = (*shared / "data/gsm8k/test.jsonl").string();
  eval.problems = 3;
  eval.options.max_new_tokens = 4;
  const auto record = qwen::cli::evaluate(eval);
  CHECK(record.at("problems") == 3);
  CHECK(record.at("max_new_tokens") == 4);
  // What a training run's evaluation computes on the same problems.
  auto model = qwen::load_model(model_dir);
  const auto tokenizer = qwen::Tokenizer::from_directory(model_dir);
  auto problems = qwen::load_problems(eval.test_file).problems;
  problems.resize(3);
  const int64_t correct =
      qwen::greedy_correct(model, tokenizer, problems, qwen::rollout_options(eval.options, tokenizer));
  CHECK(record.at("correct") == correct);

  // generate on the same questions: the prompts are training's, the rewards scored against the answers.
  std::stringstream input;
  for (const auto& problem : problems) {
    input << nlohmann::json{{"question", problem.question}, {"answer", "... #### " + problem.reference}}.dump() << "\n";
  }
  qwen::cli::GenerateOptions options;
  options.max_new_tokens = 4;
  const auto lines = qwen::cli::read_generate_input(input, "questions.jsonl", tokenizer, options);
  REQUIRE(lines.size() == 3);
  std::ostringstream out;
  const auto summary = qwen::cli::generate_lines(model, tokenizer, lines, options, out);
  CHECK(summary.scored == 3);
  CHECK(summary.correct == correct);  // greedy, the same budget and stop ids: the evaluation's responses
  for (std::size_t i = 0; i < 3; ++i) {
    CHECK(lines[i].prompt == qwen::prompt_ids(tokenizer, options.system_prompt, problems[i].question));
  }
}
