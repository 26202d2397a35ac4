// Regressions of what the fuzz targets (tests/fuzz) found, each as a plain test so that the suite keeps it fixed
// without a fuzzer. The inputs that found them are also in tests/fuzz/corpus/<target>/regression-*.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "qwen_gsm8k/common/json_lines.hpp"
#include "qwen_gsm8k/data/data.hpp"
#include "qwen_gsm8k/model/config.hpp"
#include "qwen_gsm8k/model/safetensors_header.hpp"
#include "qwen_gsm8k/text/chat_template.hpp"
#include "qwen_gsm8k/text/tokenizer.hpp"
#include "qwen_gsm8k/train/trainer_state_file.hpp"
#include "support/files.hpp"
#include "support/qwen_fixtures.hpp"

namespace {

using dapo::test::contains;

// The message of what `read` throws; "" when it throws nothing. Anything but the documented std::runtime_error or
// std::invalid_argument (such as nlohmann's own exceptions, which name no file) escapes and fails the test.
template <typename Read>
std::string refusal(Read&& read) {
  try {
    read();
  } catch (const std::invalid_argument& error) {
    return error.what();
  } catch (const std::runtime_error& error) {
    return error.what();
  }
  return "";
}

}  // namespace

// Found by shard_index_fuzz and trainer_state_fuzz: nlohmann::json::parse refuses a number too large for a double
// with out_of_range (406), not parse_error, and every reader caught only parse_error, so the exception escaped
// without the file's name (and ended the program). Each reader of JSON text now says which file and where.
TEST_CASE("fuzz regression: every JSON reader refuses a number too large for a double, naming its file") {
  const std::string huge = "1" + std::string(400, '7') + "e999";
  dapo::test::ScratchDir scratch;
  const auto dir = scratch.path();
  const auto where = [](const std::string& message, const std::string& file) {
    INFO(message);
    CHECK(contains(message, file));
    CHECK(contains(message, "a number too large for a double"));
  };

  where(refusal([&] { qwen::parse_shard_index(R"({"weight_map": {"a": )" + huge + "}}", "index.json"); }),
        "index.json");
  where(refusal([&] { qwen::parse_trainer_state(R"({"step": )" + huge + "}", "trainer_state.json"); }),
        "trainer_state.json");

  const std::string header = R"({"w": {"dtype": "F32", "shape": [)" + huge + R"(], "data_offsets": [0, 4]}})";
  std::vector<std::byte> file(8 + header.size() + 4);
  const uint64_t length = header.size();
  std::memcpy(file.data(), &length, 8);
  std::memcpy(file.data() + 8, header.data(), header.size());
  where(refusal([&] { qwen::parse_safetensors_header(file, "model.safetensors"); }), "model.safetensors");

  dapo::test::write_file(dir / "config.json", R"({"model_type": "qwen2", "vocab_size": )" + huge + "}");
  where(refusal([&] { qwen::Config::from_file(dir / "config.json"); }), "config.json");

  dapo::test::write_file(dir / "rows.jsonl", "{\"step\": 1}\n{\"step\": " + huge + "}\n");
  where(refusal([&] { qwen::read_json_lines(dir / "rows.jsonl"); }), "rows.jsonl:2");

  dapo::test::write_file(dir / "data.jsonl", R"({"question": "q", "answer": "#### 1", "n": )" + huge + "}\n");
  where(refusal([&] { qwen::load_problems(dir / "data.jsonl"); }), "data.jsonl:1");

  dapo::test::write_file(dir / "tokenizer.json", R"({"version": )" + huge + "}");
  where(refusal([&] { qwen::Tokenizer::from_directory(dir); }), "tokenizer.json");

  std::filesystem::remove(dir / "tokenizer.json");
  dapo::test::write_file(dir / "tokenizer_config.json", R"({"chat_template": "x", "n": )" + huge + "}");
  where(refusal([&] { qwen::read_chat_template(dir); }), "tokenizer_config.json");
}

// Found by config_json_fuzz: json.value(key, fallback) throws nlohmann's type_error (naming no file) when the field
// is there with another type, as in "hidden_act": null. config.json's optional fields, and the optional fields of
// tokenizer.json and tokenizer_config.json read the same way, are now checked for their type, naming file and field.
TEST_CASE("fuzz regression: an optional field of another type is refused naming the file and the field") {
  dapo::test::ScratchDir scratch;
  const auto config = scratch.path() / "config.json";
  const std::string base = R"("model_type": "qwen2", "vocab_size": 8, "hidden_size": 8, "intermediate_size": 8,
                              "num_hidden_layers": 1, "num_attention_heads": 2)";
  for (const std::string field :
       {R"("hidden_act": null)", R"("model_type": 2)", R"("tie_word_embeddings": "yes")", R"("use_sliding_window": 1)",
        R"("torch_dtype": 16)", R"("rope_parameters": {"rope_type": []})"}) {
    dapo::test::write_file(config, "{" + base + ", " + field + "}");
    const std::string message = refusal([&] { qwen::Config::from_file(config); });
    INFO(field << ": " << message);
    CHECK(contains(message, config.string()));
    CHECK(contains(message, field.substr(1, field.find('"', 1) - 1)));
  }
  dapo::test::write_file(config, "{" + base + R"(, "torch_dtype": null, "dtype": "bfloat16"})");
  CHECK(qwen::Config::from_file(config).torch_dtype == "bfloat16");  // null reads as not given
}
