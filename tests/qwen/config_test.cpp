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
  CHECK(changed("layer_types", {"full_attention", "sliding_attention"})
            .find("only \"full_attention\" layers are supported") != std::string::npos);
  CHECK(changed("rope_parameters", {{"rope_type", "yarn"}, {"rope_theta", 1e6}, {"factor", 4.0}})
            .find("only plain RoPE (\"default\")") != std::string::npos);
  CHECK(changed("rope_parameters", {{"rope_type", "default"}, {"rope_theta", 1e4}}).find("disagree") !=
        std::string::npos);
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

TEST_CASE("config.json as transformers 5 writes it: RoPE base under rope_parameters, dtype, layer_types") {
  // Qwen2Config.save_pretrained in transformers 5 keeps no top-level rope_theta or torch_dtype; reading the base from
  // the wrong place would silently use 10000 instead of 1e6.
  const nlohmann::json v5 = {{"model_type", "qwen2"},
                             {"vocab_size", 512},
                             {"hidden_size", 64},
                             {"intermediate_size", 160},
                             {"num_hidden_layers", 2},
                             {"num_attention_heads", 4},
                             {"num_key_value_heads", 2},
                             {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 1000000.0}}},
                             {"layer_types", {"full_attention", "full_attention"}},
                             {"dtype", "bfloat16"}};
  const auto config = qwen::Config::from_json(v5, "v5.json");
  CHECK(config.rope_theta == 1e6);
  CHECK(config.torch_dtype == "bfloat16");
  nlohmann::json both = v5;
  both["rope_theta"] = 1000000.0;  // written by both versions' conventions: fine when they agree
  CHECK(qwen::Config::from_json(both, "both.json").rope_theta == 1e6);
  nlohmann::json legacy = v5;
  legacy.erase("rope_parameters");
  CHECK(qwen::Config::from_json(legacy, "legacy.json").rope_theta == 10000.0);  // Qwen2Config's default
}
