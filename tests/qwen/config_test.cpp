// config.json: the fixtures parse; unsupported architectures and broken files are refused with the file named.
#include "qwen_gsm8k/model/config.hpp"
#include "support/qwen_fixtures.hpp"

TEST_CASE("config.json of the tiny fixtures parses, and writes back what it read") {
  const auto dir = dapo::test::qwen_fixture("tiny-tied-f32");
  if (!dir) return;
  const auto config = qwen::Config::from_file(*dir / "config.json");
  CHECK(config.hidden_size == 64);
  CHECK(config.num_hidden_layers == 2);
  CHECK(config.num_key_value_heads == 2);
  CHECK(config.head_dim() == 16);
  CHECK(config.tie_word_embeddings);
  CHECK(config.eos_token_ids == std::vector<int64_t>{511});
  CHECK(config.rope_theta == 1e6);
  const auto again = qwen::Config::from_json(config.to_json(), "round trip");
  CHECK(again.to_json() == config.to_json());
}

TEST_CASE("config.json errors name the file and the field") {
  const nlohmann::json good = {{"model_type", "qwen2"},    {"vocab_size", 512},       {"hidden_size", 64},
                               {"intermediate_size", 160}, {"num_hidden_layers", 2},  {"num_attention_heads", 4},
                               {"num_key_value_heads", 2}, {"rope_theta", 1000000.0}, {"eos_token_id", {1, 2}}};
  CHECK(qwen::Config::from_json(good, "c.json").eos_token_ids == std::vector<int64_t>{1, 2});
  auto error_of = [&](nlohmann::json json) {
    try {
      qwen::Config::from_json(json, "c.json");
    } catch (const std::invalid_argument& error) {
      return std::string(error.what());
    }
    return std::string("no error");
  };
  auto changed = [&](const char* key, nlohmann::json value) {
    nlohmann::json json = good;
    json[key] = value;
    return error_of(json);
  };
  CHECK(changed("model_type", "llama") ==
        "c.json: model_type is \"llama\", expected \"qwen2\" (this driver implements "
        "Qwen2 / Qwen2.5)");
  CHECK(changed("hidden_act", "gelu").find("only \"silu\" is supported") != std::string::npos);
  CHECK(changed("use_sliding_window", true).find("sliding-window attention is not supported") != std::string::npos);
  CHECK(changed("rope_scaling", {{"type", "yarn"}}).find("only plain RoPE") != std::string::npos);
  CHECK(changed("hidden_size", "64").find("field \"hidden_size\" is \"64\", expected an integer") != std::string::npos);
  CHECK(changed("num_key_value_heads", 3).find("not a multiple of num_key_value_heads 3") != std::string::npos);
  CHECK(changed("vocab_size", 0).find("vocab_size is 0, expected > 0") != std::string::npos);
  nlohmann::json missing = good;
  missing.erase("num_hidden_layers");
  CHECK(error_of(missing) == "c.json: missing field \"num_hidden_layers\"");

  dapo::test::ScratchDir scratch;
  std::ofstream(scratch.path() / "config.json") << "{\"model_type\": \"qwen2\", ";
  CHECK_THROWS_WITH_AS(qwen::Config::from_file(scratch.path() / "config.json"),
                       doctest::Contains("invalid JSON at byte"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(qwen::Config::from_file(scratch.path() / "absent.json"), doctest::Contains("cannot open"),
                       std::runtime_error);
}
