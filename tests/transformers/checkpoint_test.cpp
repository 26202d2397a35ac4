// Checkpoints our trainer wrote (`qwen_gsm8k train`, scripts/transformers-check.sh), as transformers reads them
// (tests/transformers/references.py checkpoints): the model class and stored dtype, tied embeddings, the tokenizer's
// ids for GSM8K questions and conversations (the chat template), the generation config, and logits of a left-padded
// batch within 1e-4 of ours. One checkpoint is the demo's, whose tokenizer files our Tokenizer::save wrote.
// Shapes: B = rows, T = the longest row, V = vocabulary.
#include <torch/torch.h>

#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "qwen_gsm8k/engine/generate.hpp"
#include "qwen_gsm8k/model/safetensors.hpp"
#include "qwen_gsm8k/model/weights.hpp"
#include "qwen_gsm8k/text/chat.hpp"
#include "qwen_gsm8k/text/tokenizer.hpp"
#include "support/shared.hpp"
#include "transformers/references.hpp"

namespace {

// Paths in checkpoints.json are relative to the clone (the root sees it at /src, this program at DAPO_SOURCE_DIR).
std::filesystem::path in_clone(const std::string& path) {
  const std::filesystem::path p(path);
  return p.is_absolute() ? p : std::filesystem::path(DAPO_SOURCE_DIR) / p;
}

nlohmann::json read_file_json(const std::filesystem::path& path) {
  std::ifstream in(path);
  REQUIRE_MESSAGE(in.good(), "cannot read " << path);
  return nlohmann::json::parse(in);
}

torch::Tensor stored(const qwen::SafetensorsFile& file, const std::string& name) {
  const auto* entry = file.find(name);
  REQUIRE_MESSAGE(entry != nullptr, file.path() << " has no tensor " << name);
  return file.view(*entry).clone();
}

}  // namespace

TEST_CASE("our trainer's checkpoints load in transformers with every key, and it computes our logits within 1e-4") {
  const auto report = dapo::test::read_reference("checkpoints.json");
  const auto& checkpoints = report.at("checkpoints");
  REQUIRE_MESSAGE(checkpoints.size() >= 3, "checkpoints.json holds " << checkpoints.size() << " checkpoints");
  std::set<std::string> dtypes;
  int64_t sharded = 0;
  for (const auto& item : checkpoints) {
    const std::filesystem::path dir = in_clone(item.at("dir"));
    CAPTURE(dir);
    CHECK(item.at("class") == "Qwen2ForCausalLM");
    for (const auto& [kind, keys] : item.at("loading_info").items()) {
      CAPTURE(kind);
      CHECK(keys.empty());  // missing_keys, unexpected_keys, mismatched_keys, error_msgs
    }
    const auto config = read_file_json(dir / "config.json");
    const std::string dtype = config.contains("dtype") ? config.at("dtype") : config.at("torch_dtype");
    CHECK(item.at("stored_dtype") == dtype);
    dtypes.insert(dtype);
    CHECK(item.at("tied") == config.value("tie_word_embeddings", false));
    if (std::filesystem::exists(dir / "model.safetensors.index.json")) ++sharded;

    // The tokenizer saved beside the weights: our ids for the questions are transformers'.
    const auto tokenizer = qwen::Tokenizer::from_directory(dir);
    const auto questions = item.at("questions").get<std::vector<std::string>>();
    const auto ids = item.at("question_ids").get<std::vector<std::vector<int32_t>>>();
    REQUIRE(questions.size() == ids.size());
    CHECK(questions.size() >= 200);
    int64_t differing = 0;
    for (std::size_t q = 0; q < questions.size(); ++q) {
      if (tokenizer.encode(questions[q]) != ids[q]) {
        if (++differing <= 3) CHECK_MESSAGE(false, "question " << q << " encodes differently: " << questions[q]);
      }
    }
    CHECK(differing == 0);
    CHECK(item.at("pad_token_id") == tokenizer.pad_token_id().value_or(-1));
    // Conversations rendered by the checkpoint's chat template (apply_chat_template): our text and ids.
    const std::string system = item.at("chat_system");
    const auto& chat_texts = item.at("chat_texts");
    const auto& chat_ids = item.at("chat_ids");
    REQUIRE(chat_texts.size() == chat_ids.size());
    CHECK(chat_texts.size() >= 10);
    for (std::size_t q = 0; q < chat_texts.size(); ++q) {
      CAPTURE(q);
      const std::string text = qwen::render_chat({{"system", system}, {"user", questions[q]}}, true);
      CHECK(text == chat_texts[q].get<std::string>());
      CHECK(tokenizer.encode(text) == chat_ids[q].get<std::vector<int32_t>>());
    }
    CHECK(item.at("eos_token_id") == tokenizer.eos_token_id().value_or(-1));

    // The generation config: every field we wrote, read by transformers with the same value.
    const auto ours = read_file_json(dir / "generation_config.json");
    const auto& theirs = item.at("generation_config");
    for (const auto& [key, value] : ours.items()) {
      if (key == "transformers_version") continue;
      CAPTURE(key);
      REQUIRE(theirs.contains(key));
      if (value.is_number_float()) {
        CHECK(theirs.at(key).get<double>() == doctest::Approx(value.get<double>()).epsilon(1e-12));
      } else {
        CHECK(theirs.at(key) == value);
      }
    }

    // Logits of transformers' left-padded batch, at the real tokens.
    const auto outputs = qwen::SafetensorsFile::open(dapo::test::transformers_references() / item.at("outputs"));
    const torch::Tensor input_ids = stored(outputs, "input_ids"), mask = stored(outputs, "attention_mask");
    const torch::Tensor expected = stored(outputs, "logits");  // [B, T, V]
    auto model = qwen::load_model(dir, torch::kFloat32);
    torch::Tensor logits;
    {
      const torch::NoGradGuard no_grad;
      logits = model->forward(input_ids, mask, qwen::position_ids_from_mask(mask));
    }
    REQUIRE(logits.sizes() == expected.sizes());
    const torch::Tensor real = mask.to(torch::kBool).unsqueeze(-1);
    const double error = (logits - expected).abs().masked_select(real).max().item<double>();
    MESSAGE(item.at("dir").get<std::string>() << " (" << dtype << "): logits max |diff| " << error << " over "
                                              << mask.sum().item<int64_t>() << " tokens x " << logits.size(-1));
    CHECK(error < 1e-4);
  }
  CHECK(dtypes.count("float32") == 1);
  CHECK(dtypes.count("bfloat16") == 1);
  CHECK(sharded >= 1);
}
