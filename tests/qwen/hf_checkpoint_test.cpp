// Checkpoints as Hugging Face model directories, what model.save_pretrained(dir) + tokenizer.save_pretrained(dir)
// leave: the input's config.json with every field kept (only the dtype updated), its generation_config.json (or one
// derived from the config), its tokenizer files, and weights sharded as transformers shards them (names, index, a
// tensor larger than the limit in a shard of its own) that load back bit for bit; a trainer's checkpoints of such a
// directory, keep_checkpoints honoured, resumed from a sharded checkpoint; the progress lines of saving and loading.
#include <unistd.h>

#include <torch/torch.h>

#include <cstdio>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "qwen_gsm8k/model/weights.hpp"
#include "qwen_gsm8k/train/trainer.hpp"
#include "support/process.hpp"
#include "support/qwen_fixtures.hpp"
#include "support/tiny_model.hpp"

namespace {

using dapo::test::read_json;
using dapo::test::read_text;

std::set<std::string> files_in(const std::filesystem::path& dir) {
  std::set<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) names.insert(entry.path().filename().string());
  return names;
}

void check_same_parameters(qwen::Qwen2ForCausalLM& a, qwen::Qwen2ForCausalLM& b) {
  const auto theirs = b->named_parameters();
  REQUIRE(a->named_parameters().size() == theirs.size());
  for (const auto& item : a->named_parameters()) {
    CAPTURE(item.key());
    REQUIRE(theirs.contains(item.key()));
    CHECK(torch::equal(item.value(), theirs[item.key()]));  // bit for bit
  }
}

// The tiny model of these tests: vocab 32, hidden 16, 2 heads of 8, 1 KV head, intermediate 32, 1 layer, tied.
qwen::Qwen2ForCausalLM tiny_model() {
  torch::manual_seed(1);
  qwen::Config config = dapo::test::tiny_qwen_config(32, 16, 2, 1, 1);
  config.bos_token_id = 30;
  config.eos_token_ids = {31};
  qwen::Qwen2ForCausalLM model(config);
  qwen::initialize_weights(model);
  return model;
}

// stdout (the trainer's progress lines) into a file for one scope.
class CapturedStdout {
 public:
  explicit CapturedStdout(const std::filesystem::path& file) : file_(file) {
    std::fflush(stdout);
    saved_ = ::dup(1);
    std::FILE* target = std::fopen(file.c_str(), "w");
    REQUIRE(target != nullptr);
    ::dup2(::fileno(target), 1);
    std::fclose(target);
  }
  ~CapturedStdout() { restore(); }
  CapturedStdout(const CapturedStdout&) = delete;
  CapturedStdout& operator=(const CapturedStdout&) = delete;
  // Ends the capture; what was printed.
  std::string text() {
    restore();
    return read_text(file_);
  }

 private:
  void restore() {
    if (saved_ < 0) return;
    std::fflush(stdout);
    ::dup2(saved_, 1);
    ::close(saved_);
    saved_ = -1;
  }
  std::filesystem::path file_;
  int saved_ = -1;
};

}  // namespace

TEST_CASE("save_model shards as transformers does: a tensor over the limit alone, the index; loads back bit for bit") {
  auto model = tiny_model();
  dapo::test::ScratchDir scratch;
  const auto dir = scratch.path();
  // Float32 sizes in parameter order: embed_tokens 2048 B | q 1024, q bias 64, k 512, k bias 32 | v 512, v bias 32,
  // o 1024 | gate 2048 | up 2048 | down 2048 | 3 norms of 64. With a limit of 2000 B: embed_tokens, gate, up and down
  // are each over it (a shard of their own, placed before the shard being filled); q..k bias fill a shard until v
  // would tip it over (1632 + 512 > 2000); v, o and the norms make the last one.
  qwen::save_model(model, dir, {.max_shard_bytes = 2000});
  const std::vector<std::string> shards{"model-00001-of-00006.safetensors", "model-00002-of-00006.safetensors",
                                        "model-00003-of-00006.safetensors", "model-00004-of-00006.safetensors",
                                        "model-00005-of-00006.safetensors", "model-00006-of-00006.safetensors"};
  std::set<std::string> expected_files{"config.json", "generation_config.json", "model.safetensors.index.json"};
  expected_files.insert(shards.begin(), shards.end());
  CHECK(files_in(dir) == expected_files);
  const auto index = read_json(dir / "model.safetensors.index.json");
  const std::string layer = "model.layers.0.";
  const nlohmann::json weight_map{{"model.embed_tokens.weight", shards[0]},
                                  {layer + "self_attn.q_proj.weight", shards[1]},
                                  {layer + "self_attn.q_proj.bias", shards[1]},
                                  {layer + "self_attn.k_proj.weight", shards[1]},
                                  {layer + "self_attn.k_proj.bias", shards[1]},
                                  {layer + "mlp.gate_proj.weight", shards[2]},
                                  {layer + "mlp.up_proj.weight", shards[3]},
                                  {layer + "mlp.down_proj.weight", shards[4]},
                                  {layer + "self_attn.v_proj.weight", shards[5]},
                                  {layer + "self_attn.v_proj.bias", shards[5]},
                                  {layer + "self_attn.o_proj.weight", shards[5]},
                                  {layer + "input_layernorm.weight", shards[5]},
                                  {layer + "post_attention_layernorm.weight", shards[5]},
                                  {"model.norm.weight", shards[5]}};
  CHECK(index.at("weight_map") == weight_map);
  CHECK(index.at("metadata") == nlohmann::json{{"total_parameters", 2896}, {"total_size", 11584}});
  // transformers' json.dumps(index, indent=2, sort_keys=True) + "\n": keys sorted, two-space indent.
  CHECK(read_text(dir / "model.safetensors.index.json") == index.dump(2) + "\n");

  std::vector<std::string> lines;
  auto reloaded = qwen::load_model(dir, torch::kFloat32, torch::kCPU,
                                   {.progress = [&](const std::string& line) { lines.push_back(line); }});
  check_same_parameters(reloaded, model);
  REQUIRE(lines.size() == 7);  // one per file (its size with the safetensors header), then the total
  CHECK(lines[0] == "loading weights (1 of 6 files): model-00001-of-00006.safetensors, 2.2 kB...");
  CHECK(lines[6].rfind("loaded 14 tensors (", 0) == 0);

  // Saved again unsharded into the same directory: the shards and the index of the first save are gone (a stale
  // index would be read instead of the new file); and the reverse.
  qwen::save_model(model, dir);
  CHECK(files_in(dir) == std::set<std::string>{"config.json", "generation_config.json", "model.safetensors"});
  auto single = qwen::load_model(dir);
  check_same_parameters(single, model);
  qwen::save_model(model, dir, {.max_shard_bytes = 2000});
  CHECK(files_in(dir) == expected_files);
  // transformers' default limit, 5 GB: a model that fits is one model.safetensors without an index.
  qwen::save_model(model, dir, {.max_shard_bytes = 5'000'000'000});
  CHECK(files_in(dir) == std::set<std::string>{"config.json", "generation_config.json", "model.safetensors"});
}

TEST_CASE("save_model: config.json kept field for field from the source, dtype updated; generation_config.json") {
  auto model = tiny_model();
  dapo::test::ScratchDir scratch;
  const auto source = scratch.path() / "source", out = scratch.path() / "out";
  std::filesystem::create_directories(source);

  SUBCASE("no source (the demo): our config.json, and generation_config.json derived from it") {
    qwen::save_model(model, out, {.progress = [](const std::string&) {}});
    qwen::Config expected = model->config();
    expected.torch_dtype = "float32";
    CHECK(read_json(out / "config.json") == expected.to_json());
    // transformers' GenerationConfig.from_model_config: the special token ids, marked as derived.
    CHECK(read_json(out / "generation_config.json") ==
          nlohmann::json{{"_from_model_config", true}, {"bos_token_id", 30}, {"eos_token_id", 31}});
  }
  SUBCASE("a transformers 4 source: every field kept, torch_dtype updated, generation_config.json copied") {
    nlohmann::json original = model->config().to_json();
    original["torch_dtype"] = "bfloat16";
    original["transformers_version"] = "4.43.1";
    original["use_cache"] = true;
    original["initializer_range"] = 0.02;
    original["max_window_layers"] = 21;
    original["eos_token_id"] = nlohmann::json{31, 29};  // a list, as Qwen2.5-Instruct has
    original["unknown_to_us"] = {{"kept", "as it was"}};
    std::ofstream(source / "config.json") << original.dump(2);
    const std::string generation = "{\n  \"do_sample\": true,\n  \"temperature\": 0.7,\n  \"top_p\": 0.8\n}\n";
    std::ofstream(source / "generation_config.json") << generation;
    // The model as loaded from it (the eos list is part of its config).
    qwen::Qwen2ForCausalLM loaded(qwen::Config::from_json(original, "test"));
    loaded->to(torch::kBFloat16);
    qwen::save_model(loaded, out, {.source_dir = source});
    CHECK(read_json(out / "config.json") == original);  // saved in its own dtype: every field as it was
    loaded->to(torch::kFloat32);
    qwen::save_model(loaded, out, {.source_dir = source});
    nlohmann::json expected = original;
    expected["torch_dtype"] = "float32";
    CHECK(read_json(out / "config.json") == expected);
    CHECK_FALSE(read_json(out / "config.json").contains("dtype"));
    CHECK(read_text(out / "generation_config.json") == generation);  // byte for byte
  }
  SUBCASE("a transformers 5 source (dtype, no torch_dtype, no generation_config.json)") {
    nlohmann::json original = model->config().to_json();
    original.erase("torch_dtype");
    original["dtype"] = "bfloat16";
    std::ofstream(source / "config.json") << original.dump();
    qwen::save_model(model, out, {.source_dir = source});
    nlohmann::json expected = original;
    expected["dtype"] = "float32";
    CHECK(read_json(out / "config.json") == expected);
    CHECK(read_json(out / "generation_config.json") ==
          nlohmann::json{{"_from_model_config", true}, {"bos_token_id", 30}, {"eos_token_id", 31}});
  }
  SUBCASE("a source whose config.json is another model's is refused, naming the file and the field") {
    nlohmann::json other = model->config().to_json();
    other["num_hidden_layers"] = 2;
    std::ofstream(source / "config.json") << other.dump();
    const std::string message =
        (source / "config.json").string() + ": field \"num_hidden_layers\" is 2 but the model being saved has 1";
    CHECK_THROWS_WITH_AS(qwen::save_model(model, out, {.source_dir = source}), doctest::Contains(message.c_str()),
                         std::invalid_argument);
  }
}

TEST_CASE("trainer checkpoints are Hugging Face directories: input files kept, sharded, save_total_limit, resume") {
  const auto shared = dapo::test::require_shared("fixtures/tokenizer/qwen2.5", "data/gsm8k");
  if (!shared) return;
  dapo::test::ScratchDir scratch;
  const auto model_dir = scratch.path() / "model";
  // The input model directory as the Hub has it: weights, a config.json with fields this implementation never reads,
  // a generation_config.json, and every kind of tokenizer file (the slow tokenizer's ones are stand-ins here: copied,
  // never read), plus a file that is not the model's.
  torch::manual_seed(0);
  nlohmann::json config{{"architectures", {"Qwen2ForCausalLM"}},
                        {"model_type", "qwen2"},
                        {"vocab_size", 151936},
                        {"hidden_size", 32},
                        {"intermediate_size", 64},
                        {"num_hidden_layers", 2},
                        {"num_attention_heads", 4},
                        {"num_key_value_heads", 2},
                        {"max_position_embeddings", 2048},
                        {"rope_theta", 1000000.0},
                        {"tie_word_embeddings", true},
                        {"bos_token_id", 151643},
                        {"eos_token_id", 151645},
                        {"hidden_act", "silu"},
                        {"torch_dtype", "bfloat16"},
                        {"transformers_version", "4.43.1"},
                        {"use_cache", true},
                        {"initializer_range", 0.02},
                        {"max_window_layers", 21}};
  {
    qwen::Qwen2ForCausalLM model(qwen::Config::from_json(config, "test"));
    qwen::initialize_weights(model);
    qwen::save_model(model, model_dir);
  }
  std::ofstream(model_dir / "config.json") << config.dump(2) << "\n";
  const std::string generation =
      "{\n  \"bos_token_id\": 151643,\n  \"do_sample\": true,\n  \"eos_token_id\": [\n"
      "    151645,\n    151643\n  ],\n  \"top_k\": 20\n}\n";
  std::ofstream(model_dir / "generation_config.json") << generation;
  for (const char* file : {"tokenizer.json", "tokenizer_config.json"}) {
    std::filesystem::copy_file(*shared / "fixtures/tokenizer/qwen2.5" / file, model_dir / file);
  }
  const std::vector<std::string> stand_ins{"vocab.json", "merges.txt", "special_tokens_map.json", "added_tokens.json",
                                           "chat_template.jinja"};
  for (const auto& file : stand_ins) std::ofstream(model_dir / file) << "stand-in for " << file << "\n";
  std::ofstream(model_dir / "README.md") << "# not part of a checkpoint\n";

  const auto train = qwen::load_problems(*shared / "data/gsm8k/train.jsonl").problems;
  const auto test = qwen::load_problems(*shared / "data/gsm8k/test.jsonl").problems;
  const auto tokenizer = qwen::Tokenizer::from_directory(model_dir);
  auto options = dapo::test::small_train_options(scratch.path() / "run");
  options.model_dir = model_dir;  // the train command's --model
  options.keep_checkpoints = 1;   // save_total_limit 1: step 1's checkpoint goes when step 2's is complete
  // The embedding (151936 x 32 float32, 19.4 MB) over the limit alone, the rest in shards of at most 40 KB.
  options.max_shard_bytes = 40'000;
  options.quiet = false;
  qwen::Trainer first(qwen::load_model(model_dir), tokenizer, train, test, options);
  std::string printed;
  {
    CapturedStdout captured(scratch.path() / "stdout");
    first.run();
    printed = captured.text();
  }
  const auto root = scratch.path() / "run" / "checkpoints";
  CHECK(files_in(root) == std::set<std::string>{"latest", "step-000002"});  // keep_checkpoints
  const auto checkpoint = root / "step-000002";
  const auto index = read_json(checkpoint / "model.safetensors.index.json");
  std::set<std::string> shard_files;
  for (const auto& [name, file] : index.at("weight_map").items()) shard_files.insert(file.get<std::string>());
  const std::size_t shards = shard_files.size();
  REQUIRE(shards >= 3);
  std::set<std::string> expected{"config.json",          "generation_config.json", "model.safetensors.index.json",
                                 "optimizer.pt",         "trainer_state.json",     "tokenizer.json",
                                 "tokenizer_config.json"};
  expected.insert(stand_ins.begin(), stand_ins.end());
  char name[64];
  for (std::size_t i = 1; i <= shards; ++i) {
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i, shards);
    expected.insert(name);
  }
  CHECK(files_in(checkpoint) == expected);
  config["torch_dtype"] = "float32";  // what the trainer's float32 weights are saved in; every other field as it was
  CHECK(read_json(checkpoint / "config.json") == config);
  CHECK(read_text(checkpoint / "generation_config.json") == generation);
  for (const char* file : {"tokenizer.json", "tokenizer_config.json"}) {
    CHECK(read_text(checkpoint / file) == read_text(model_dir / file));
  }
  for (const auto& file : stand_ins) CHECK(read_text(checkpoint / file) == read_text(model_dir / file));
  // The progress lines of each save (unless quiet), one per shard, then the time.
  CAPTURE(printed);
  std::snprintf(name, sizeof name, "model-00001-of-%05zu.safetensors", shards);
  CHECK(printed.find("checkpoint step-000001: writing weights (1 of " + std::to_string(shards) + " shards): " + name) !=
        std::string::npos);
  CHECK(printed.find("checkpoint step-000002: writing optimizer state...") != std::string::npos);
  CHECK(printed.find("checkpoint step-000002: saved in ") != std::string::npos);

  // The sharded checkpoint loads bit for bit, and a run resumes from it.
  auto reloaded = qwen::load_model(checkpoint);
  check_same_parameters(reloaded, first.model());
  auto resumed_options = options;
  resumed_options.total_steps = 3;
  resumed_options.output_dir = scratch.path() / "resumed";
  resumed_options.quiet = true;
  qwen::Trainer second(qwen::load_model(model_dir), tokenizer, train, test, resumed_options);
  second.resume(checkpoint);
  CHECK(second.step_index() == 2);
  check_same_parameters(second.model(), first.model());
  second.step();
  CHECK(second.step_index() == 3);
}
