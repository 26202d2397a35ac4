// The trainer end to end on CPU: the real path (the Qwen2.5 vocabulary and tokenizer, GSM8K lines) for two steps
// with metrics, report, checkpoint, reload and resume; the decoupled clip acting only off-policy; dynamic sampling
// dropping all-equal groups and stopping with its error; bad options; an update with a non-finite gradient skipped.
#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <dapo/advantage.hpp>

#include <cmath>
#include <limits>
#include <optional>
#include <tuple>

#include "qwen_gsm8k/common/json_lines.hpp"
#include "qwen_gsm8k/demo/demo.hpp"
#include "qwen_gsm8k/demo/demo_problems.hpp"
#include "qwen_gsm8k/model/autocast.hpp"
#include "qwen_gsm8k/model/weights.hpp"
#include "qwen_gsm8k/train/batch.hpp"
#include "qwen_gsm8k/train/checkpoint.hpp"
#include "qwen_gsm8k/train/trainer.hpp"
#include "qwen_gsm8k/train/update.hpp"
#include "support/qwen_fixtures.hpp"
#include "support/tensors.hpp"
#include "support/tiny_model.hpp"

namespace {

// Timing fields differ between runs; everything else must repeat exactly.
// The clock's metrics (timing_s/*, perf/* but the token count): they differ between two runs of the same step.
bool timing_field(const std::string& key) {
  return key.starts_with("timing_s/") || (key.starts_with("perf/") && key != "perf/total_num_tokens");
}

}  // namespace

TEST_CASE("real path: Qwen2.5 vocabulary and tokenizer, 2 DAPO steps on GSM8K, checkpoint reload and exact resume") {
  const auto shared = dapo::test::require_shared("fixtures/tokenizer/qwen2.5", "data/gsm8k");
  if (!shared) return;
  dapo::test::ScratchDir scratch;
  const auto model_dir = scratch.path() / "model";
  torch::manual_seed(0);
  {
    qwen::Qwen2ForCausalLM model(qwen::Config::from_json({{"model_type", "qwen2"},
                                                          {"vocab_size", 151936},
                                                          {"hidden_size", 32},
                                                          {"intermediate_size", 64},
                                                          {"num_hidden_layers", 2},
                                                          {"num_attention_heads", 4},
                                                          {"num_key_value_heads", 2},
                                                          {"max_position_embeddings", 2048},
                                                          {"rope_theta", 1000000.0},
                                                          {"tie_word_embeddings", true},
                                                          {"eos_token_id", 151645}},
                                                         "test"));
    qwen::initialize_weights(model);
    qwen::save_model(model, model_dir);
  }
  for (const char* file : {"tokenizer.json", "tokenizer_config.json"}) {
    std::filesystem::copy_file(*shared / "fixtures/tokenizer/qwen2.5" / file, model_dir / file);
  }
  const auto train = qwen::load_problems(*shared / "data/gsm8k/train.jsonl").problems;
  const auto test = qwen::load_problems(*shared / "data/gsm8k/test.jsonl").problems;
  const auto tokenizer = qwen::Tokenizer::from_directory(model_dir);
  auto options = dapo::test::small_train_options(scratch.path() / "run");
  options.model_dir = model_dir;

  qwen::Trainer first(qwen::load_model(model_dir), tokenizer, train, test, options);
  first.run();
  const auto out = scratch.path() / "run";
  CHECK(qwen::read_json_lines(out / "metrics.jsonl").size() == 2);
  CHECK(qwen::read_json_lines(out / "eval.jsonl").size() == 2);  // at the start and at the end
  CHECK(std::filesystem::exists(out / "report.html"));
  CHECK(std::filesystem::exists(out / "plots" / "reward.svg"));
  // rollouts/: the first log_rollouts trained groups of each step, a line per response, with its advantage.
  for (const char* step_file : {"step-000001.jsonl", "step-000002.jsonl"}) {
    const auto rows = qwen::read_json_lines(out / "rollouts" / step_file);
    REQUIRE(rows.size() == static_cast<std::size_t>(options.log_rollouts * options.rollout_n));
    double advantage_sum = 0;
    for (const auto& row : rows) {
      for (const char* key : {"question", "reference", "prompt", "response", "score", "rewards", "advantage"}) {
        CHECK_MESSAGE(row.contains(key), key);
      }
      CHECK(row.at("prompt").get<std::string>().find(row.at("question").get<std::string>()) != std::string::npos);
      advantage_sum += row.at("advantage").get<double>();
    }
    CHECK(advantage_sum == doctest::Approx(0.0).epsilon(1e-5));  // whole groups: their advantages have mean 0
  }
  const auto checkpoint = out / "checkpoints" / "step-000002";
  for (const char* file :
       {"config.json", "model.safetensors", "optimizer.pt", "trainer_state.json", "tokenizer.json"}) {
    CHECK(std::filesystem::exists(checkpoint / file));
  }
  CHECK(qwen::find_checkpoint(out / "checkpoints") == checkpoint);
  const auto metrics = first.metrics();
  // verl's names (docs/driver.md's table), and ours under their own prefixes.
  for (const char* key : {"actor/pg_clipfrac",
                          "actor/pg_clipfrac_lower",
                          "actor/ppo_kl",
                          "actor/entropy",
                          "actor/pg_loss",
                          "actor/grad_norm",
                          "actor/lr",
                          "critic/score/mean",
                          "critic/score/max",
                          "critic/score/min",
                          "critic/advantages/mean",
                          "critic/advantages/max",
                          "critic/advantages/min",
                          "response_length/mean",
                          "response_length/max",
                          "response_length/min",
                          "response_length/clip_ratio",
                          "prompt_length/mean",
                          "timing_s/gen",
                          "timing_s/update_actor",
                          "timing_s/step",
                          "perf/throughput",
                          "train/num_gen_batches",
                          "dapo/kept_groups",
                          "dapo/filtered_groups",
                          "dapo/dropped_groups",
                          "perf/decode_calls",
                          "perf/prefill_calls",
                          "perf/engine_checks",
                          "perf/graph_captures",
                          "perf/graph_replays",
                          "perf/host_reads",
                          "perf/host_fetches",
                          "perf/host_copies",
                          "sampled/score/mean",
                          "sampled/accuracy",
                          "reward/correctness",
                          "reward/overlong",
                          "perf/rollout_tokens_per_second",
                          "perf/update_tokens_per_second"}) {
    CHECK_MESSAGE(metrics.back().contains(key), key);
  }
  // The step's peak tensor memory on the CPU: at least the weights (held throughout), their gradients and AdamW's two
  // moments (all alive at the optimizer step), float32 here.
  const double weights_gb =
      static_cast<double>(qwen::tensor_bytes(first.model()->parameters())) / (1024.0 * 1024.0 * 1024.0);
  CHECK(metrics.back().at("perf/max_memory_allocated_gb").get<double>() >= 4.0 * weights_gb);
  CHECK(!metrics.back().contains("perf/max_memory_reserved_gb"));  // CUDA's caching allocator only
  // Each rollout admits at least once and reads the finished flags at least once; CUDA graphs only on a GPU.
  CHECK(metrics.back().at("perf/prefill_calls").get<int64_t>() >= 1);
  CHECK(metrics.back().at("perf/engine_checks").get<int64_t>() >= 1);
  CHECK(metrics.back().at("perf/graph_captures").get<int64_t>() == 0);
  CHECK(metrics.back().at("perf/graph_replays").get<int64_t>() == 0);
  // One wait per check, its read of the finished flags; the finished rows' outputs come as fetches, taken a step
  // later; copies at admissions and compactions.
  CHECK(metrics.back().at("perf/host_reads").get<int64_t>() == metrics.back().at("perf/engine_checks").get<int64_t>());
  CHECK(metrics.back().at("perf/host_fetches").get<int64_t>() > 0);
  CHECK(metrics.back().at("perf/host_copies").get<int64_t>() > 0);
  // Group advantages of the trained batch have mean 0 per group, so over the batch's tokens they straddle 0.
  CHECK(metrics.back().at("critic/advantages/min").get<double>() <= 0.0);
  CHECK(metrics.back().at("critic/advantages/max").get<double>() >= 0.0);

  // The checkpoint reloads with identical logits.
  {
    auto reloaded = qwen::load_model(checkpoint);
    const auto ids = torch::tensor({{151644, 872, 198, 17, 10, 17, 30}}, torch::kInt64);
    const auto mask = torch::ones_like(ids);
    torch::NoGradGuard no_grad;
    CHECK(torch::equal(reloaded->forward(ids, mask, qwen::position_ids_from_mask(mask)),
                       first.model()->forward(ids, mask, qwen::position_ids_from_mask(mask))));
  }

  // Resuming from step 1 repeats step 2 exactly: same metrics, same weights.
  std::filesystem::copy(out, scratch.path() / "resumed", std::filesystem::copy_options::recursive);
  options.output_dir = scratch.path() / "resumed";
  qwen::Trainer second(qwen::load_model(model_dir), tokenizer, train, test, options);
  second.resume(options.output_dir / "checkpoints" / "step-000001");
  CHECK(second.step_index() == 1);
  CHECK(second.metrics().size() == 1);
  const auto again = second.step();
  for (const auto& [key, value] : metrics[1].items()) {
    if (timing_field(key)) continue;
    CAPTURE(key);
    CHECK(again.at(key) == value);
  }
  for (const auto& item : second.model()->named_parameters()) {
    CHECK(torch::equal(item.value(), first.model()->named_parameters()[item.key()]));
  }
  // Different settings are refused on resume.
  auto changed = options;
  changed.lr = 5e-4;
  qwen::Trainer third(qwen::load_model(model_dir), tokenizer, train, test, changed);
  CHECK_THROWS_WITH_AS(third.resume(options.output_dir / "checkpoints"), doctest::Contains("option lr was 0.001"),
                       std::invalid_argument);
}

TEST_CASE("the clip acts only off-policy, and dynamic sampling drops groups whose responses agree") {
  dapo::test::ScratchDir scratch;
  qwen::DemoOptions demo;
  demo.output_dir = scratch.path();
  demo.seed = 5;
  // Warm-started until it answers half of the training problems, then trained at the demo's learning rate: groups both
  // agree and disagree, and the policy stays there. Nothing leans on one LibTorch version's random stream (1.13's and
  // 2.x's draws differ): the warm start stops on accuracy, dynamic sampling may take up to 32 rounds per step, and
  // the checks are over the whole run, 24 groups kept of however many were drawn.
  demo.sft_steps = 600;
  demo.sft_min_steps = 100;
  demo.sft_target_accuracy = 0.5;
  demo.max_num_gen_batches = 32;
  demo.sft_check_problems = 50;
  demo.sft_batch = 32;
  demo.rl_steps = 3;
  demo.rl_groups = 8;
  demo.rl_mini_groups = 2;  // four updates per epoch: three of them off-policy
  demo.rollout_n = 4;       // the seed project's: a group of 4 agrees often enough to be dropped now and then
  demo.ppo_epochs = 1;
  demo.rl_lr = 6e-4;
  demo.rl_warmup_steps = 0;  // the full rate from the first update: 12 updates are too few to warm up and still clip
  demo.cosine_schedule = false;
  demo.eval_problems = 8;
  demo.eval_every = 0;
  demo.quiet = true;
  qwen::run_demo(demo);
  const auto rows = qwen::read_json_lines(scratch.path() / "metrics.jsonl");
  REQUIRE(rows.size() == 3);
  double off_policy_clip = 0;
  int64_t filtered = 0;
  for (const auto& row : rows) {
    const auto clips = row.at("actor/pg_clipfrac_by_update").get<std::vector<double>>();
    REQUIRE(clips.size() == 4);
    CAPTURE(row.dump());
    CHECK(clips[0] == 0.0);  // the first update is on-policy: the ratio is exactly 1
    off_policy_clip = std::max({off_policy_clip, clips[1], clips[2], clips[3]});
    CHECK(row.at("dapo/kept_groups") == 8);
    filtered += row.at("dapo/filtered_groups").get<int64_t>();
    // Streaming: the groups taken after the eighth informative one (in prompt order) are dropped, finished or not; no
    // more prompts were taken than max_num_gen_batches rounds hold.
    CHECK(row.at("dapo/dropped_groups").get<int64_t>() >= 0);
    CHECK(row.at("train/num_gen_batches").get<int64_t>() <= 32);
    CHECK(row.at("dapo/surplus_groups") == 0);  // the engine stops at the eighth
  }
  CHECK(off_policy_clip > 0.0);  // the later updates of a step are off-policy, and there the clip acts
  CHECK(filtered > 0);           // all-right or all-wrong groups were drawn and dropped
  CHECK(std::filesystem::exists(scratch.path() / "summary.json"));
}

TEST_CASE("dynamic sampling stops with its clear error when max_num_gen_batches rounds find no informative group") {
  torch::manual_seed(0);
  qwen::Qwen2ForCausalLM model(qwen::demo_model_config());
  qwen::initialize_weights(model);  // random: never right, so every group's accuracies agree
  const auto problems = qwen::make_demo_problems({.test_count = 4});
  auto options = dapo::test::small_train_options({});
  options.dynamic_sampling = true;
  options.max_num_gen_batches = 2;
  options.max_new_tokens = 4;
  options.system_prompt = "Answer.";
  qwen::Trainer trainer(model, qwen::Tokenizer::byte_level({"<|endoftext|>", "<|im_start|>", "<|im_end|>"}),
                        problems.train, problems.test, options);
  CHECK_THROWS_WITH_AS(
      trainer.step(),
      doctest::Contains("4 prompts (2 generation rounds, max_num_gen_batches = 2) kept 0 informative groups of the 2 "
                        "wanted"),
      std::runtime_error);
}

TEST_CASE("autocast (mixed precision): bfloat16 forward passes over float32 weights, close to the float32 step") {
  // On CPU, where LibTorch 1.13 has bfloat16 autocast too; on CUDA the same guard switches the CUDA state.
  const auto problems = qwen::make_demo_problems({.test_count = 4});
  auto run = [&](std::optional<torch::ScalarType> autocast) {
    torch::manual_seed(0);
    qwen::Qwen2ForCausalLM model(qwen::demo_model_config());
    qwen::initialize_weights(model);
    auto options = dapo::test::demo_step_options();
    options.autocast = autocast;
    qwen::Trainer trainer(model, qwen::Tokenizer::byte_level({"<|endoftext|>", "<|im_start|>", "<|im_end|>"}),
                          problems.train, problems.test, options);
    const auto before = model->parameters()[0].detach().clone();
    const nlohmann::json row = trainer.step();
    for (const auto& parameter : model->parameters()) CHECK(parameter.dtype() == torch::kFloat32);
    CHECK_FALSE(model->parameters()[0].detach().equal(before));  // it trained
    return row;
  };
  const nlohmann::json mixed = run(torch::kBFloat16), full = run(std::nullopt);
  CHECK(std::isfinite(mixed.at("actor/pg_loss").get<double>()));
  // The same rollouts are not guaranteed (sampling sees bfloat16 logits), so compare what does not depend on them
  // much: the entropy of a random model's next-token distribution over 259 tokens is near log(259) either way.
  CHECK(mixed.at("actor/entropy").get<double>() ==
        doctest::Approx(full.at("actor/entropy").get<double>()).epsilon(0.02));
  CHECK(mixed.at("actor/entropy").get<double>() != full.at("actor/entropy").get<double>());  // bfloat16 did run
  CHECK_FALSE(qwen::active_autocast_dtype(torch::kCPU).has_value());  // the guard restored the state
}

TEST_CASE("rollout: ids of the model's padded vocabulary (beyond the tokenizer's) decode to nothing, as in HF") {
  // Qwen2.5's embedding has 151936 rows for 151665 tokens; a sampled padding id must not stop training.
  torch::manual_seed(0);
  nlohmann::json config = qwen::demo_model_config().to_json();
  config["vocab_size"] = 300;  // the byte tokenizer has 259
  config["tie_word_embeddings"] = false;
  qwen::Qwen2ForCausalLM model(qwen::Config::from_json(config, "padded vocabulary"));
  qwen::initialize_weights(model);
  {
    torch::NoGradGuard no_grad;
    model->lm_head_weight().zero_();  // uniform next-token distribution: 41 of 300 ids are padding
  }
  const auto tokenizer = qwen::Tokenizer::byte_level({"<|endoftext|>", "<|im_start|>", "<|im_end|>"});
  qwen::RolloutOptions options;
  options.group_size = 8;
  options.generation.max_new_tokens = 16;
  options.generation.sampling.temperature = 1.0;
  options.system_prompt = "Answer.";
  const auto problems = qwen::make_demo_problems({.test_count = 2});
  const auto groups = qwen::rollout(model, tokenizer, {problems.test[0]}, options, /*seed=*/5);
  int64_t padded = 0;
  for (const auto& response : groups.at(0).responses) {
    for (const int64_t id : response.ids) padded += id >= tokenizer.vocab_size();
    CHECK(response.text.size() <= response.ids.size() * 4);
  }
  CHECK(padded > 0);  // the case did occur
}

TEST_CASE("train options are checked with the option named") {
  auto options = dapo::test::small_train_options({});
  auto error_of = [](const qwen::TrainOptions& o) {
    try {
      o.validate();
    } catch (const std::invalid_argument& error) {
      return std::string(error.what());
    }
    return std::string("no error");
  };
  CHECK(error_of(options) == "no error");
  auto bad = options;
  bad.ppo_mini_batch_size = 3;
  CHECK(error_of(bad).find("ppo_mini_batch_size 3 must divide train_batch_size 2") != std::string::npos);
  bad = options;
  bad.rollout_n = 1;
  CHECK(error_of(bad).find("rollout_n is 1, expected >= 2") != std::string::npos);
  bad = options;
  bad.loss.clip_high = -1;
  CHECK(error_of(bad).find("clip_high is -1") != std::string::npos);
  bad = options;
  bad.rewards.overlong_cache = 100;
  CHECK(error_of(bad).find("overlong_buffer_len 100 must lie in [0, max_new_tokens]") != std::string::npos);
  bad = options;
  bad.autocast = torch::kFloat64;
  CHECK(error_of(bad).find("autocast must be bfloat16 or float16") != std::string::npos);
  bad = options;
  bad.extras.kl_loss_type = "k4";
  CHECK(error_of(bad).find("kl_loss_type: dapo::parse_kl_penalty") != std::string::npos);
  bad = options;
  bad.extras.kl_loss_coef = -0.1;
  CHECK(error_of(bad).find("kl_loss_coef must be a finite value >= 0") != std::string::npos);
  bad = options;
  bad.extras.rollout_is = "row";
  CHECK(error_of(bad).find("rollout_is: dapo::parse_rollout_is: rollout_is is 'row'") != std::string::npos);
  bad = options;
  bad.extras.rollout_rs = "token_k9";
  CHECK(error_of(bad).find("rollout_rs: dapo::parse_rollout_rs: rollout_rs option 'token_k9'") != std::string::npos);
  bad = options;
  bad.extras.rollout_rs = "token_k1";
  bad.loss.aggregation = dapo::LossAggregation::kGroupTokenMean;
  bad.loss.group_size = bad.rollout_n;
  CHECK(error_of(bad).find("choose another loss_agg_mode") != std::string::npos);
}

TEST_CASE("--max-new-tokens sets the generation budget, overlong shaping, Dr. GRPO's divisor and the truncated count") {
  auto options = dapo::test::small_train_options({});
  options.max_new_tokens = 37;
  const auto tokenizer = qwen::Tokenizer::byte_level({"<|endoftext|>", "<|im_start|>", "<|im_end|>"});
  const qwen::ResponseBudget budget = qwen::response_budget(options);
  CHECK(budget.generation_tokens == 37);
  CHECK(budget.overlong_max_length == 37);
  CHECK(budget.norm_length == 37.0);
  CHECK(budget.truncated_at == 37);
  const qwen::RolloutOptions rollout = qwen::rollout_options(options, tokenizer);
  CHECK(rollout.generation.max_new_tokens == 37);
  CHECK(rollout.rewards.max_length == 37);
  options.loss.norm_length = 512.0;  // set explicitly (TRL's max_completion_length differing from the budget)
  CHECK(qwen::response_budget(options).norm_length == 512.0);
  CHECK(qwen::response_budget(options).generation_tokens == 37);
}

TEST_CASE("a non-finite gradient skips its update: weights and AdamW state untouched, the skip counted") {
  const qwen::Config config = dapo::test::tiny_qwen_config(32, 16, 2, 1, 1);
  // Two groups of two responses; one optimizer update over both, in two micro-batches of one group.
  std::vector<qwen::BatchRow> rows;
  for (int64_t r = 0; r < 4; ++r) rows.push_back({{1, 2, 3, 4 + r, 5 + r, 6, 7 + r}, 3, true});
  qwen::TrainOptions options;
  options.ppo_mini_batch_size = 2;
  options.ppo_micro_batch_size = 1;
  options.ppo_epochs = 1;
  options.lr = 1e-2;
  const auto run = [&](const torch::Tensor& advantages) {
    torch::manual_seed(0);
    qwen::Qwen2ForCausalLM model(config);
    std::vector<torch::Tensor> before;
    for (const auto& parameter : model->parameters()) before.push_back(parameter.detach().clone());
    qwen::ClippedAdamW optimizer(model->parameters(), torch::optim::AdamWOptions(options.lr));
    const auto communicator = qwen::Communicator::create({}, torch::kCPU);
    qwen::TrainBatch batch{qwen::pad_rows(rows, 0), advantages, {}, 2, 2};
    qwen::PolicyUpdate update{model, optimizer, *communicator, options};
    int64_t updates = 0;
    const qwen::UpdateMetrics metrics = update.run(batch, updates);
    bool unchanged = true;
    const auto after = model->parameters();
    for (std::size_t i = 0; i < before.size(); ++i) unchanged = unchanged && torch::equal(before[i], after[i]);
    return std::tuple{metrics, unchanged, optimizer.state().size(), updates};
  };
  // The control: finite advantages move the weights and fill AdamW's state.
  const auto [finite, finite_unchanged, finite_state, finite_updates] = run(torch::tensor({1.0f, -1.0f, 0.5f, -0.5f}));
  CHECK(finite.skipped_updates == 0);
  CHECK_FALSE(finite_unchanged);
  CHECK(finite_state > 0);
  CHECK(std::isfinite(finite.grad_norm));
  // A NaN advantage in the second micro-batch makes the summed gradient NaN: the update is skipped.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const auto [poisoned, unchanged, state, updates] = run(torch::tensor({1.0f, -1.0f, nan, -0.5f}));
  CHECK(poisoned.skipped_updates == 1);
  CHECK(unchanged);
  CHECK(state == 0);
  CHECK(updates == 1);  // the learning-rate schedule's clock advances all the same
  CHECK(std::isfinite(poisoned.loss));
  CHECK(std::isfinite(poisoned.grad_norm));
  CHECK(std::isfinite(poisoned.clip_fraction));
}

TEST_CASE("the first update's forward gives its mini-batch's old log-probs: bitwise those of a forward without grad") {
  // Grouped-query attention, rows of different lengths (padding), two mini-batches of two micro-batches, two epochs:
  // the first mini-batch's old log-probs and entropy come from its first update, the second's from the pass before.
  const qwen::Config config = dapo::test::tiny_qwen_config(48, 32, 4, 2, 2);
  torch::manual_seed(11);
  qwen::Qwen2ForCausalLM model(config);
  qwen::initialize_weights(model, 0.2);
  std::vector<qwen::BatchRow> rows;
  for (int64_t r = 0; r < 8; ++r) {
    std::vector<int64_t> tokens;
    for (int64_t t = 0; t < 9 + (r * 5) % 7; ++t) tokens.push_back((r * 13 + t * 7) % 47 + 1);
    rows.push_back({tokens, 4 + r % 3, true});
  }
  qwen::TrainOptions options;
  options.ppo_mini_batch_size = 2;  // groups of 2 responses: two mini-batches of two groups
  options.ppo_micro_batch_size = 1;
  options.ppo_epochs = 2;
  options.lr = 1e-2;
  qwen::TrainBatch batch{
      qwen::pad_rows(rows, 0), torch::tensor({1.0f, -1.0f, 0.5f, -0.5f, 2.0f, -2.0f, 1.5f, -1.5f}), {}, 4, 2};

  // What the no-grad pass over every micro-batch gives before any update: the old log-probs and their entropy.
  const auto communicator = qwen::Communicator::create({}, torch::kCPU);
  const auto plan = qwen::plan_mini_batches(batch, {.mini_groups = 2, .micro_groups = 1}, 0, 2);
  REQUIRE(plan.size() == 2);
  torch::Tensor expected = torch::zeros(batch.padded.loss_mask.sizes(), torch::kFloat32);
  double entropy = 0.0;
  {
    const torch::NoGradGuard no_grad;
    for (const auto& mini : plan) {
      for (const auto& micro : mini.micro_batches) {
        const qwen::TargetLogprobs out =
            qwen::micro_batch_logprobs(model, batch.padded, micro, {.with_entropy = true}, options.shared_prompt);
        micro.put(expected, out.logp);
        entropy += out.entropy_sum.item<double>();
      }
    }
  }

  qwen::ClippedAdamW optimizer(model->parameters(), torch::optim::AdamWOptions(options.lr));
  qwen::PolicyUpdate update{model, optimizer, *communicator, options};
  int64_t updates = 0;
  const qwen::UpdateMetrics metrics = update.run(batch, updates);
  REQUIRE(updates == 4);
  CHECK(torch::equal(batch.old_logp, expected));
  CHECK(batch.old_logp.narrow(0, 0, 4).abs().sum().item<double>() > 0);  // the first mini-batch's were written
  CHECK(metrics.entropy == entropy / batch.padded.loss_mask.sum().item<double>());
  CHECK(metrics.clip_fraction_by_update.at(0) == 0.0);
  CHECK(metrics.clip_fraction_by_update.at(2) > 0.0);  // the later updates are off-policy: the clip acts
}

TEST_CASE("build_train_batch: verl's estimators give one advantage per response, grpo stays group_advantages") {
  // Two groups of three responses, scores (1, 0, 0) and (2, 2, 0), lengths 3, 1, 2 and 1, 4, 2.
  std::vector<qwen::Group> groups(2);
  const double scores[2][3] = {{1.0, 0.0, 0.0}, {2.0, 2.0, 0.0}};
  const int64_t lengths[2][3] = {{3, 1, 2}, {1, 4, 2}};
  for (int g = 0; g < 2; ++g) {
    groups[static_cast<std::size_t>(g)].prompt = {1, 2};
    for (int r = 0; r < 3; ++r) {
      qwen::Response response;
      response.ids.assign(static_cast<std::size_t>(lengths[g][r]), 7);
      response.score.total = scores[g][r];
      groups[static_cast<std::size_t>(g)].responses.push_back(response);
    }
  }
  const auto advantages = [&](dapo::AdvantageEstimator estimator) {
    return dapo::test::values(qwen::build_train_batch(groups, 3, 0, false, {}, estimator).advantages);
  };
  const auto rloo = advantages(dapo::AdvantageEstimator::kRloo);
  const std::vector<double> rloo_expected{1.0, -0.5, -0.5, 1.0, 1.0, -2.0};  // s - mean of the group's others
  const auto opo = advantages(dapo::AdvantageEstimator::kOpo);
  // OPO's baseline weights scores by length: (3 * 1) / 6 = 0.5 and (1 * 2 + 4 * 2) / 7 = 10 / 7.
  const std::vector<double> opo_expected{0.5, -0.5, -0.5, 2.0 - 10.0 / 7.0, 2.0 - 10.0 / 7.0, -10.0 / 7.0};
  const auto grpo = advantages(dapo::AdvantageEstimator::kGrpo);
  const auto group = dapo::test::values(
      dapo::group_advantages(torch::tensor(std::vector<double>{1, 0, 0, 2, 2, 0}, torch::kFloat64), 3, {}));
  for (std::size_t i = 0; i < 6; ++i) {
    CAPTURE(i);
    CHECK(rloo[i] == doctest::Approx(rloo_expected[i]).epsilon(1e-6));
    CHECK(opo[i] == doctest::Approx(opo_expected[i]).epsilon(1e-6));
    CHECK(grpo[i] == doctest::Approx(group[i]).epsilon(1e-6));
  }
}

TEST_CASE("dummy accuracy: a share P of distinct texts counts correct, each text always the same, other rewards kept") {
  qwen::RewardOptions options;
  options.dummy_accuracy = 0.7;
  int64_t correct = 0;
  constexpr int64_t kTexts = 4000;
  for (int64_t i = 0; i < kTexts; ++i) {
    const std::string text = "random tokens " + std::to_string(i * 7919);
    const qwen::ResponseScore score = qwen::score_response(text, "72", 16, options);
    CHECK(score.correct == (score.parts.correctness > 0.0));
    CHECK(score.correct == qwen::score_response(text, "18", 16, options).correct);  // the text decides, not the answer
    correct += score.correct ? 1 : 0;
  }
  // Binomial(4000, 0.7): standard deviation 0.0072; the hash is fixed, so this is the same every run.
  CHECK(static_cast<double>(correct) / kTexts == doctest::Approx(0.7).epsilon(0.04 / 0.7));
  // The seed's other rewards are computed as always: a well-formed answer keeps its format and tag rewards.
  const std::string formatted = "<think>\nadd\n</think>\n<answer>\n72\n</answer>\n";
  const qwen::ResponseScore dummy = qwen::score_response(formatted, "72", 16, options);
  const qwen::ResponseScore seed = qwen::score_response(formatted, "72", 16, qwen::RewardOptions{});
  CHECK(seed.correct);
  CHECK(dummy.parts.hard_format == seed.parts.hard_format);
  CHECK(dummy.parts.mark == seed.parts.mark);
  CHECK(dummy.parts.digit == seed.parts.digit);
}
