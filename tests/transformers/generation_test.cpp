// qwen::generate and the generation engine against transformers' generate() (tests/transformers/references.py): greedy,
// a left-padded batch, EOS and pad ids set, max_new_tokens, rows that stop at EOS early; token for token, with and
// without the KV cache. Shapes: B = prompts, N = max_new_tokens, L = the longest row transformers returns (it stops
// when all rows have).
#include <torch/torch.h>

#include <fstream>
#include <string>
#include <vector>

#include "qwen_gsm8k/engine/engine.hpp"
#include "qwen_gsm8k/engine/generate.hpp"
#include "qwen_gsm8k/model/weights.hpp"
#include "transformers/references.hpp"

namespace {

// How many tokens of transformers' row count: up to and including the first EOS, else all (pad ids follow an EOS).
std::size_t length_to_eos(const std::vector<int64_t>& tokens, int64_t eos) {
  for (std::size_t t = 0; t < tokens.size(); ++t) {
    if (tokens[t] == eos) return t + 1;
  }
  return tokens.size();
}

}  // namespace

TEST_CASE("greedy generate() of a left-padded batch with EOS and pad ids: transformers' tokens, lengths and stops") {
  const auto json = dapo::test::read_reference("generation.json");
  const auto& cases = json.at("cases");
  REQUIRE_MESSAGE(!cases.empty(), "generation.json holds no cases");
  int64_t rows = 0, early = 0, tokens = 0;
  for (const auto& item : cases) {
    const std::string model_dir = item.at("model");
    CAPTURE(model_dir);
    auto model = qwen::load_model(dapo::test::transformers_references() / model_dir, torch::kFloat32);
    const auto prompts = item.at("prompts").get<std::vector<std::vector<int64_t>>>();
    const auto expected = item.at("sequences").get<std::vector<std::vector<int64_t>>>();  // [B, L]
    REQUIRE(expected.size() == prompts.size());
    const int64_t eos = item.at("eos_token_id"), pad = item.at("pad_token_id");
    qwen::GenerationOptions options;
    options.max_new_tokens = item.at("max_new_tokens");
    options.stop_ids = {eos};
    options.pad_id = pad;
    options.sampling.temperature = 0.0;
    for (const bool use_cache : {true, false}) {  // the engine (generate()), and the reference decoder (no cache)
      CAPTURE(use_cache);
      const auto output =
          use_cache ? qwen::generate(model, prompts, options) : qwen::reference_generate(model, prompts, options);
      for (std::size_t b = 0; b < prompts.size(); ++b) {
        CAPTURE(b);
        const auto& theirs = expected[b];
        REQUIRE(static_cast<int64_t>(theirs.size()) <= options.max_new_tokens);
        // transformers' row: tokens up to and including EOS, then pad ids to L.
        const std::size_t length = length_to_eos(theirs, eos);
        const bool stopped = length < theirs.size() || (length > 0 && theirs[length - 1] == eos);
        const torch::Tensor row = output.tokens[static_cast<int64_t>(b)].cpu();
        const std::vector<int64_t> ours(row.data_ptr<int64_t>(), row.data_ptr<int64_t>() + row.numel());
        CHECK(output.lengths[static_cast<int64_t>(b)].item<int64_t>() == static_cast<int64_t>(length));
        CHECK(output.truncated[static_cast<int64_t>(b)].item<bool>() == !stopped);
        CHECK(std::vector<int64_t>(ours.begin(), ours.begin() + static_cast<std::ptrdiff_t>(length)) ==
              std::vector<int64_t>(theirs.begin(), theirs.begin() + static_cast<std::ptrdiff_t>(length)));
        for (std::size_t t = length; t < ours.size(); ++t) CHECK(ours[t] == pad);
        for (std::size_t t = length; t < theirs.size(); ++t) CHECK(theirs[t] == pad);
        if (use_cache) {
          ++rows;
          tokens += static_cast<int64_t>(length);
          if (stopped && static_cast<int64_t>(length) < options.max_new_tokens) ++early;
        }
      }
    }
  }
  MESSAGE(rows << " rows of " << cases.size() << " batches, " << tokens << " tokens, " << early
               << " rows stopped by EOS before max_new_tokens");
  CHECK(early > 0);
  CHECK(early < rows);
}

TEST_CASE("the generation engine's greedy sequences are transformers' for pool sizes 1, 3 and every row") {
  const auto json = dapo::test::read_reference("generation.json");
  const auto& cases = json.at("cases");
  REQUIRE_MESSAGE(!cases.empty(), "generation.json holds no cases");
  for (const auto& item : cases) {
    const std::string model_dir = item.at("model");
    CAPTURE(model_dir);
    auto model = qwen::load_model(dapo::test::transformers_references() / model_dir, torch::kFloat32);
    const auto prompts = item.at("prompts").get<std::vector<std::vector<int64_t>>>();
    const auto expected = item.at("sequences").get<std::vector<std::vector<int64_t>>>();  // [B, L]
    const int64_t eos = item.at("eos_token_id");
    std::vector<qwen::EngineRequest> requests;
    for (const auto& prompt : prompts) requests.push_back({.prompt = prompt, .n = 1, .seed = 0});
    qwen::EngineOptions options;
    options.max_new_tokens = item.at("max_new_tokens");
    options.stop_ids = {eos};
    options.sampling.temperature = 0.0;
    for (const int64_t pool : {int64_t{1}, int64_t{3}, static_cast<int64_t>(prompts.size())}) {
      CAPTURE(pool);
      options.max_num_seqs = pool;
      const auto out = qwen::generate_requests(model, requests, options);
      for (std::size_t b = 0; b < prompts.size(); ++b) {
        CAPTURE(b);
        const auto& theirs = expected[b];
        const std::size_t length = length_to_eos(theirs, eos);
        const auto& ours = out[b][0];
        CHECK(ours.tokens ==
              std::vector<int64_t>(theirs.begin(), theirs.begin() + static_cast<std::ptrdiff_t>(length)));
        const bool stopped = length > 0 && theirs[length - 1] == eos;
        CHECK((ours.finish_reason == qwen::FinishReason::kStop) == stopped);
      }
    }
  }
}

// scripts/transformers-check.sh ran `qwen_gsm8k generate --max-num-seqs 3` on the demo's checkpoint for 12
// conversations (references.py's generate_input.jsonl) and transformers' generate() on the same ones (generate.json):
// the same prompt ids from each side's tokenizer and chat template, and the same greedy tokens up to the first step
// whose top-1 and top-2 logits lie within min_margin (another float order may flip it), the whole row where none does.
TEST_CASE("qwen_gsm8k generate on the demo's checkpoint with 3 slots for 12 prompts gives transformers' generate()") {
  const auto reference = dapo::test::read_reference("generate.json");
  const auto& rows = reference.at("rows");
  const double min_margin = reference.at("min_margin");
  const auto path = dapo::test::transformers_references() / "generate_ours.jsonl";
  std::ifstream in(path);
  REQUIRE_MESSAGE(in.good(), "cannot read " << path << " (written by scripts/transformers-check.sh)");
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  REQUIRE(lines.size() == rows.size());
  REQUIRE(rows.size() > 3);  // more prompts than slots
  std::size_t whole = 0, compared = 0;
  for (std::size_t b = 0; b < rows.size(); ++b) {
    CAPTURE(b);
    const auto& row = rows[b];
    const auto& line = lines[b];
    CHECK(line.at("index") == b);
    CHECK(line.at("prompt_token_ids") == row.at("prompt_ids"));
    REQUIRE(line.at("outputs").size() == 1);
    const auto ours = line.at("outputs")[0].at("token_ids").get<std::vector<int64_t>>();
    const auto theirs = row.at("tokens").get<std::vector<int64_t>>();
    const auto margins = row.at("margins").get<std::vector<double>>();
    REQUIRE(margins.size() == theirs.size());
    std::size_t sure = 0;  // tokens before the first near-tie
    while (sure < theirs.size() && margins[sure] >= min_margin) ++sure;
    REQUIRE(ours.size() >= sure);
    CHECK(std::vector<int64_t>(ours.begin(), ours.begin() + static_cast<std::ptrdiff_t>(sure)) ==
          std::vector<int64_t>(theirs.begin(), theirs.begin() + static_cast<std::ptrdiff_t>(sure)));
    compared += sure;
    if (sure == theirs.size()) {
      ++whole;
      CHECK(ours == theirs);
      CHECK(line.at("outputs")[0].at("finish_reason") == (row.at("stopped").get<bool>() ? "stop" : "length"));
    }
  }
  MESSAGE(whole << " of " << rows.size() << " rows compared whole, " << compared << " tokens");
  CHECK(2 * whole >= rows.size());
}
