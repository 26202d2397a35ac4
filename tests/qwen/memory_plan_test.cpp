// The memory plan (train/memory_plan.hpp): its parameter counts against real models, its phases and peak, what
// checkpointing and a token budget change, the settings it proposes, and `train --memory-plan` on the documented
// real run (the seed's 48 GB GPU). The plan's bytes against measured peaks are benchmarks/memory_bench's.
#include <doctest/doctest.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "qwen_gsm8k/cli/commands.hpp"
#include "qwen_gsm8k/model/device_memory.hpp"
#include "qwen_gsm8k/model/model.hpp"
#include "qwen_gsm8k/train/memory_plan.hpp"
#include "support/documented_commands.hpp"
#include "support/qwen_fixtures.hpp"
#include "support/tiny_model.hpp"

namespace {

// Qwen2.5-1.5B-Instruct's config.json (its published architecture fields).
qwen::Config qwen25_1_5b() {
  return qwen::Config::from_json({{"model_type", "qwen2"},
                                  {"vocab_size", 151936},
                                  {"hidden_size", 1536},
                                  {"intermediate_size", 8960},
                                  {"num_hidden_layers", 28},
                                  {"num_attention_heads", 12},
                                  {"num_key_value_heads", 2},
                                  {"max_position_embeddings", 32768},
                                  {"rms_norm_eps", 1e-6},
                                  {"rope_theta", 1000000.0},
                                  {"tie_word_embeddings", true},
                                  {"eos_token_id", 151645}},
                                 "Qwen2.5-1.5B-Instruct config.json");
}

// The seed project's run (docs/driver.md, "The real run"): 8 prompts x 4 responses, 128 new tokens, updates of 4
// prompts, on CUDA under bfloat16 autocast; prompts of the GSM8K training set's longest, 250 tokens.
qwen::MemoryPlanInput seed_run() {
  qwen::MemoryPlanInput input;
  input.config = qwen25_1_5b();
  input.options.train_batch_size = 8;
  input.options.rollout_n = 4;
  input.options.ppo_mini_batch_size = 4;
  input.options.max_new_tokens = 128;
  input.options.autocast = torch::kBFloat16;
  input.max_prompt_tokens = 250;
  input.cuda = true;
  return input;
}

int64_t item(const qwen::MemoryPlan& plan, const std::string& phase, const std::string& name) {
  for (const auto& p : plan.phases) {
    if (p.name != phase) continue;
    for (const auto& i : p.items) {
      if (i.name == name) return i.bytes;
    }
  }
  FAIL("no item " << name << " in phase " << phase);
  return 0;
}

constexpr int64_t kGiB = int64_t{1} << 30;

}  // namespace

TEST_CASE("memory plan: the parameter counts are the models' own") {
  for (const bool tied : {true, false}) {
    for (const auto& [heads, kv_heads] : std::vector<std::pair<int64_t, int64_t>>{{4, 2}, {4, 4}, {6, 1}}) {
      qwen::Config config = dapo::test::tiny_qwen_config(97, 48, heads, kv_heads, 3);
      config.intermediate_size = 80;
      config.tie_word_embeddings = tied;
      CAPTURE(tied);
      CAPTURE(heads);
      qwen::Qwen2ForCausalLM model(config);
      int64_t total = 0, linear = 0;
      for (const auto& parameter : model->parameters()) total += parameter.numel();
      for (const auto& module : model->model->layers[0]->modules()) {
        if (module->as<torch::nn::Linear>() == nullptr) continue;
        for (const auto& parameter : module->parameters(/*recurse=*/false)) linear += parameter.numel();
      }
      const qwen::ParameterCounts counts = qwen::count_parameters(config);
      CHECK(counts.total == total);
      CHECK(counts.layer_linear == linear);
    }
  }
  // Qwen2.5-1.5B: 1,543,714,304 parameters (its model card's 1.54 B).
  CHECK(qwen::count_parameters(qwen25_1_5b()).total == 1'543'714'304);
}

TEST_CASE("memory plan: phases, the peak, the resident parts and the JSON") {
  qwen::MemoryPlanInput input = seed_run();
  input.options.extras.kl_loss_coef = 0.001;
  const qwen::MemoryPlan plan = qwen::plan_memory(input);
  std::vector<std::string> names;
  for (const auto& phase : plan.phases) names.push_back(phase.name);
  CHECK(names == std::vector<std::string>{"rollout", "log-probs", "update", "update: tied embedding gradient",
                                          "optimizer step"});
  int64_t largest = 0;
  for (const auto& phase : plan.phases) largest = std::max(largest, phase.bytes());
  CHECK(plan.peak_bytes() == largest);
  const int64_t parameters = qwen::count_parameters(input.config).total;
  for (const auto& phase : plan.phases) {
    CHECK(item(plan, phase.name, "weights") == 4 * parameters);
    CHECK(item(plan, phase.name, "AdamW state") == 8 * parameters);
    // The reference's 28 layers' linear weights in bfloat16, the rest (embedding, norms) float32.
    const int64_t linear = 28 * qwen::count_parameters(input.config).layer_linear;
    CHECK(item(plan, phase.name, "KL reference") == 4 * (parameters - linear) + 2 * linear);
  }
  // The KV cache of 32 rows of 250 + 128 positions, 28 layers, keys and values, 2 x 128 per position, bfloat16.
  CHECK(item(plan, "rollout", "KV cache") == 28 * 2 * 32 * 2 * 378 * 128 * 2);
  CHECK(plan.rollout_rows == 32);
  CHECK(plan.longest_row == 378);
  CHECK(plan.update_tokens == 16 * 378);

  const nlohmann::json json = plan.to_json();
  CHECK(json.at("peak_bytes").get<int64_t>() == plan.peak_bytes());
  CHECK(json.at("peak_phase") == plan.peak_phase().name);
  REQUIRE(json.at("phases").size() == plan.phases.size());
  for (std::size_t i = 0; i < plan.phases.size(); ++i) {
    CHECK(json.at("phases")[i].at("bytes").get<int64_t>() == plan.phases[i].bytes());
  }
  CHECK(plan.table().find("<- peak") != std::string::npos);
}

TEST_CASE("memory plan: checkpointing keeps at most 1/8 of the update's activations at 28 layers") {
  for (const bool long_run : {false, true}) {
    CAPTURE(long_run);
    qwen::MemoryPlanInput input = seed_run();
    if (long_run) {  // 16 prompts x 8 responses x 1,024 new tokens
      input.options.train_batch_size = 16;
      input.options.rollout_n = 8;
      input.options.ppo_mini_batch_size = 16;
      input.options.max_new_tokens = 1024;
    }
    for (const bool autocast : {false, true}) {
      if (!autocast) input.options.autocast.reset();
      const int64_t plain = item(qwen::plan_memory(input), "update", "activations");
      input.options.gradient_checkpointing = true;
      const int64_t checkpointed = item(qwen::plan_memory(input), "update", "activations");
      input.options.gradient_checkpointing = false;
      CHECK(checkpointed > 0);
      CHECK(8 * checkpointed <= plain);
    }
  }
}

TEST_CASE("memory plan: a token budget bounds the update's micro-batch; the proposed settings fit") {
  qwen::MemoryPlanInput input = seed_run();
  input.options.train_batch_size = 16;
  input.options.rollout_n = 8;
  input.options.ppo_mini_batch_size = 16;
  input.options.max_new_tokens = 1024;
  const qwen::MemoryPlan whole = qwen::plan_memory(input);
  CHECK(whole.update_tokens == 16 * 8 * (250 + 1024));
  input.options.use_dynamic_bsz = true;
  input.options.ppo_max_token_len_per_gpu = 8192;
  const qwen::MemoryPlan budget = qwen::plan_memory(input);
  CHECK(budget.update_tokens == 8192);
  CHECK(budget.logprob_tokens == 8192);
  CHECK(item(budget, "update", "activations") * whole.update_tokens ==
        item(whole, "update", "activations") * budget.update_tokens);

  // What fits 48 GB with the caching allocator's margin: each proposal, applied, plans within it.
  input.options.use_dynamic_bsz = false;
  const auto available = static_cast<int64_t>(48e9 / qwen::kCudaReservedMargin);
  REQUIRE(qwen::plan_memory(input).peak_bytes() > available);
  const std::vector<std::string> proposals = qwen::settings_that_fit(input, available);
  REQUIRE(!proposals.empty());
  for (const auto& flags : proposals) {
    CAPTURE(flags);
    qwen::MemoryPlanInput applied = input;
    std::istringstream words(flags);
    for (std::string word; words >> word;) {
      if (word == "--gradient-checkpointing") applied.options.gradient_checkpointing = true;
      if (word == "--use-dynamic-bsz") applied.options.use_dynamic_bsz = true;
      if (word == "--ppo-max-token-len-per-gpu") words >> applied.options.ppo_max_token_len_per_gpu;
      if (word == "--max-num-seqs" || word == "--max-rollout-rows") words >> applied.options.max_rollout_rows;
      if (word == "--autocast") applied.options.autocast = torch::kBFloat16, words >> word;
    }
    CHECK(qwen::plan_memory(applied).peak_bytes() <= available);
  }
  // Nothing fits where even the weights and AdamW's state do not.
  CHECK(qwen::settings_that_fit(input, 10 * kGiB).empty());
}

TEST_CASE("train --memory-plan: the documented real run plans at most 44 GiB on the seed's 48 GB GPU") {
  const auto shared = dapo::test::require_shared("fixtures/tokenizer/qwen2.5");
  if (!shared) return;
  const auto data = dapo::test::require_shared("data/gsm8k/train.jsonl");
  if (!data) return;
  dapo::test::ScratchDir scratch;
  const std::filesystem::path model = scratch.path() / "Qwen2.5-1.5B-Instruct";
  std::filesystem::create_directories(model);
  for (const auto& file : std::filesystem::directory_iterator(*shared / "fixtures" / "tokenizer" / "qwen2.5")) {
    std::filesystem::copy_file(file.path(), model / file.path().filename());
  }
  std::ofstream(model / "config.json") << qwen25_1_5b().to_json().dump();

  // The documented command's words (docs/driver.md, "The real run"), with this model and data.
  auto words =
      dapo::test::documented_command(std::filesystem::path(DAPO_SOURCE_DIR) / "docs" / "driver.md", "## The real run");
  REQUIRE(words.size() > 2);
  for (std::size_t i = 2; i + 1 < words.size(); ++i) {
    if (words[i] == "--model") words[i + 1] = model.string();
    if (words[i] == "--train") words[i + 1] = (*data / "data" / "gsm8k" / "train.jsonl").string();
    if (words[i] == "--test") words[i + 1] = (*data / "data" / "gsm8k" / "test.jsonl").string();
    if (words[i] == "--output") words[i + 1] = (scratch.path() / "run").string();
  }
  words.push_back("--memory-plan");
  words.push_back("json");
  CLI::App app;
  qwen::cli::TrainCommand train;
  qwen::cli::add_train_command(app, train);
  std::vector<std::string> args(words.rbegin(), words.rend() - 1);  // CLI11 takes them last first, without argv[0]
  REQUIRE_NOTHROW(app.parse(args));
  REQUIRE(train.memory_plan == "json");
  std::ostringstream out;
  CHECK(qwen::cli::run_memory_plan_command(train, out) == 0);
  const nlohmann::json plan = nlohmann::json::parse(out.str());
  MESSAGE("the documented real run plans " << plan.at("peak_bytes").get<double>() / kGiB << " GiB ("
                                           << plan.at("peak_phase").get<std::string>() << ")");
  CHECK(plan.at("peak_bytes").get<int64_t>() <= 44 * kGiB);
  // The same through train_memory_plan (what the CUDA check uses); nothing was loaded: no output directory made.
  CHECK(qwen::cli::train_memory_plan(train).peak_bytes() == plan.at("peak_bytes").get<int64_t>());
  CHECK(!std::filesystem::exists(scratch.path() / "run"));
}
