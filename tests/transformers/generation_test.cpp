// qwen::generate and the generation engine against transformers' generate() (tests/transformers/references.py): greedy,
// a left-padded batch, EOS and pad ids set, max_new_tokens, rows that stop at EOS early; token for token, with and
// without the KV cache. Shapes: B = prompts, N = max_new_tokens, L = the longest row transformers returns (it stops
// when all rows have).
#include <torch/torch.h>

#include <vector>

#include "qwen_gsm8k/engine/engine.hpp"
#include "qwen_gsm8k/model/generation.hpp"
#include "qwen_gsm8k/model/weights.hpp"
#include "transformers/references.hpp"

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
    for (const bool use_cache : {true, false}) {
      CAPTURE(use_cache);
      options.use_cache = use_cache;
      const auto output = qwen::generate(model, prompts, options);
      for (std::size_t b = 0; b < prompts.size(); ++b) {
        CAPTURE(b);
        const auto& theirs = expected[b];
        REQUIRE(static_cast<int64_t>(theirs.size()) <= options.max_new_tokens);
        // transformers' row: tokens up to and including EOS, then pad ids to L.
        std::size_t length = theirs.size();
        for (std::size_t t = 0; t < theirs.size(); ++t) {
          if (theirs[t] == eos) {
            length = t + 1;
            break;
          }
        }
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
        std::size_t length = theirs.size();  // tokens up to and including EOS
        for (std::size_t t = 0; t < theirs.size(); ++t) {
          if (theirs[t] == eos) {
            length = t + 1;
            break;
          }
        }
        const auto& ours = out[b][0];
        CHECK(ours.tokens ==
              std::vector<int64_t>(theirs.begin(), theirs.begin() + static_cast<std::ptrdiff_t>(length)));
        const bool stopped = length > 0 && theirs[length - 1] == eos;
        CHECK((ours.finish_reason == qwen::FinishReason::kStop) == stopped);
      }
    }
  }
}
