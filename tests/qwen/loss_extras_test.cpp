// What the update adds to the policy loss, as verl does: rollout correction from the sampler's log-probs (IS weights,
// rejection, the probability-difference metrics), a KL loss against a reference policy, an entropy term; and the
// trainer wiring them end to end (the rollouts' own log-probs, a frozen reference copy). Also what the update waits
// for: its reads of device data, counted per optimizer update with each of these on.
#include <torch/torch.h>

#include <dapo/kl_penalty.hpp>

#include <cmath>
#include <functional>
#include <vector>

#include "qwen_gsm8k/demo/demo.hpp"
#include "qwen_gsm8k/demo/demo_problems.hpp"
#include "qwen_gsm8k/model/host_door.hpp"
#include "qwen_gsm8k/model/weights.hpp"
#include "qwen_gsm8k/train/batch.hpp"
#include "qwen_gsm8k/train/trainer.hpp"
#include "qwen_gsm8k/train/update.hpp"
#include "support/tiny_model.hpp"
#include "support/weight_casts.hpp"

namespace {

// Eight rows of different lengths (padding), groups of two responses.
qwen::TrainBatch extras_batch(const torch::Tensor& advantages) {
  std::vector<qwen::BatchRow> rows;
  for (int64_t r = 0; r < 8; ++r) {
    std::vector<int64_t> tokens;
    for (int64_t t = 0; t < 9 + (r * 5) % 7; ++t) tokens.push_back((r * 13 + t * 7) % 47 + 1);
    rows.push_back({tokens, 4 + r % 3, true});
  }
  return qwen::TrainBatch{qwen::pad_rows(rows, 0), advantages, {}, 4, 2};
}

qwen::Qwen2ForCausalLM extras_model(uint64_t seed) {
  torch::manual_seed(seed);
  qwen::Qwen2ForCausalLM model(dapo::test::tiny_qwen_config(48, 32, 4, 2, 2));
  qwen::initialize_weights(model, 0.2);
  return model;
}

// The whole batch's log-probs (and entropy sum) under `model`, without grad: [B, L - 1], 0 outside the loss mask.
torch::Tensor batch_logprobs(qwen::Qwen2ForCausalLM& model, const qwen::TrainBatch& batch,
                             double* entropy_sum = nullptr) {
  const torch::NoGradGuard no_grad;
  const qwen::TargetLogprobs out =
      qwen::response_logprobs(model, batch.padded.input_ids, batch.padded.attention_mask, batch.padded.loss_mask,
                              {.with_entropy = entropy_sum != nullptr});
  if (entropy_sum != nullptr) *entropy_sum += out.entropy_sum.item<double>();
  return out.logp;
}

// The same, computed on the slices of `plan` as the update computes them (the same shapes and path, so the same bits).
torch::Tensor sliced_logprobs(qwen::Qwen2ForCausalLM& model, const qwen::TrainBatch& batch,
                              const std::vector<qwen::MiniBatch>& plan) {
  const torch::NoGradGuard no_grad;
  torch::Tensor out = torch::zeros(batch.padded.loss_mask.sizes(), torch::kFloat32);
  for (const auto& mini : plan) {
    for (const auto& micro : mini.micro_batches) {
      micro.put(out,
                qwen::micro_batch_logprobs(model, batch.padded, micro, {}, qwen::TrainOptions().shared_prompt).logp);
    }
  }
  return out;
}

// One PolicyUpdate::run on one process (AdamW, lr 1e-2); `updates` counts the optimizer updates it made.
qwen::UpdateMetrics run_update(qwen::Qwen2ForCausalLM& model, qwen::TrainBatch& batch,
                               const qwen::TrainOptions& options, qwen::Qwen2ForCausalLM* reference = nullptr,
                               int64_t* updates = nullptr) {
  options.validate();
  qwen::ClippedAdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-2));
  const auto communicator = qwen::Communicator::create({}, torch::kCPU);
  qwen::PolicyUpdate update{model, optimizer, *communicator, options, reference};
  int64_t count = 0;
  const qwen::UpdateMetrics metrics = update.run(batch, count);
  if (updates != nullptr) *updates = count;
  return metrics;
}

const torch::Tensor kAdvantages = torch::tensor({1.0f, -1.0f, 0.5f, -0.5f, 2.0f, -2.0f, 1.5f, -1.5f});

}  // namespace

TEST_CASE("rollout correction: old log-probs of every mini-batch first, IS weights, rejection, verl's metrics") {
  qwen::Qwen2ForCausalLM model = extras_model(11);
  qwen::TrainBatch batch = extras_batch(kAdvantages);
  const torch::Tensor mask_before = batch.padded.loss_mask.clone();
  const torch::Tensor old =
      sliced_logprobs(model, batch, qwen::plan_mini_batches(batch, {.mini_groups = 2, .micro_groups = 1}, 0, 2));
  // The sampler agrees everywhere but at the first response token of rows 1 and 6, where it put 3 nats more: there
  // log_ratio = -3, k1 = 3 > log 2, and token_k1 rejects them.
  batch.rollout_logp = old.clone();
  std::vector<std::pair<int64_t, int64_t>> moved;
  for (const int64_t row : {1, 6}) {
    const int64_t col = mask_before[row].to(torch::kInt64).argmax().item<int64_t>();
    batch.rollout_logp[row][col] += 3.0f;
    moved.emplace_back(row, col);
  }
  qwen::TrainOptions options;
  options.ppo_mini_batch_size = 2;  // two mini-batches of two groups, two micro-batches each
  options.ppo_micro_batch_size = 1;
  options.extras.rollout_is = "token";
  options.extras.rollout_is_threshold = "2.0";
  options.extras.rollout_rs = "token_k1";
  options.extras.rollout_rs_threshold = "2.0";
  int64_t updates = 0;
  const qwen::UpdateMetrics metrics = run_update(model, batch, options, nullptr, &updates);
  REQUIRE(updates == 2);

  // Every old log-prob came from the pass before the first update (none from an update's own forward).
  CHECK(torch::equal(batch.old_logp, old));
  // The two moved tokens left the loss; nothing else did.
  for (const auto& [row, col] : moved) CHECK_FALSE(batch.padded.loss_mask[row][col].item<bool>());
  CHECK(batch.padded.loss_mask.sum().item<int64_t>() == mask_before.sum().item<int64_t>() - 2);
  CHECK(torch::equal(batch.padded.loss_mask, batch.padded.loss_mask & mask_before));
  // IS weights exp(log_ratio) truncated at 2: 1 where the sampler agreed, e^-3 at the moved tokens.
  REQUIRE(batch.is_weights.defined());
  const torch::Tensor agreed = batch.padded.loss_mask;
  CHECK(batch.is_weights.masked_select(agreed).eq(1.0f).all().item<bool>());
  for (const auto& [row, col] : moved)
    CHECK(batch.is_weights[row][col].item<double>() == doctest::Approx(std::exp(-3.0)));
  CHECK_FALSE(metrics.rollout_correction.empty());
  // The probability differences over the response tokens before rejection: 0 but at the two moved tokens.
  REQUIRE(metrics.rollout_probs_diff.has_value());
  const torch::Tensor p_old = old.to(torch::kFloat64).exp();
  const torch::Tensor p_rollout = batch.rollout_logp.to(torch::kFloat64).exp();
  const torch::Tensor diff = (p_old - p_rollout).abs().masked_select(mask_before);
  CHECK((*metrics.rollout_probs_diff)[0] == doctest::Approx(diff.max().item<double>()).epsilon(1e-12));
  CHECK((*metrics.rollout_probs_diff)[1] == doctest::Approx(diff.mean().item<double>()).epsilon(1e-12));
  CHECK((*metrics.rollout_probs_diff)[0] > 0.0);
}

TEST_CASE("a KL loss: its value is the aggregated penalty against the reference, and it pulls the policy there") {
  qwen::Qwen2ForCausalLM model = extras_model(11), reference = extras_model(12);
  qwen::TrainBatch batch = extras_batch(torch::zeros({8}));  // no policy-gradient signal: only the KL term acts
  const torch::Tensor ref_logp = batch_logprobs(reference, batch), old = batch_logprobs(model, batch);
  const torch::Tensor mask = batch.padded.loss_mask;
  const auto kl_of = [&](const torch::Tensor& logp) {  // token-mean of k3 over the loss tokens, in double
    const torch::Tensor kl = dapo::kl_penalty(logp.to(torch::kFloat64), ref_logp.to(torch::kFloat64), "low_var_kl");
    return (kl * mask).sum().item<double>() / mask.sum().item<double>();
  };
  qwen::TrainOptions options;
  options.ppo_mini_batch_size = 4;  // one update over the whole batch, in two micro-batches
  options.ppo_micro_batch_size = 2;
  options.extras.kl_loss_coef = 1.0;
  options.extras.kl_loss_type = "low_var_kl";
  const qwen::UpdateMetrics metrics = run_update(model, batch, options, &reference);
  // The one update is on-policy: its KL loss is the starting policy's, summed over the micro-batches' shares.
  REQUIRE(metrics.kl_loss.has_value());
  const double before = kl_of(old);
  CHECK(before > 0.0);
  CHECK(*metrics.kl_loss == doctest::Approx(before).epsilon(1e-5));  // float32 log-probs against double
  CHECK(kl_of(batch_logprobs(model, batch)) < before);               // the step moved toward the reference

  // Without a reference model the update refuses a KL loss.
  CHECK_THROWS_WITH_AS(run_update(model, batch, options), doctest::Contains("needs a reference model"),
                       std::logic_error);
}

TEST_CASE("an entropy term: with no policy-gradient signal, a positive entropy_coeff raises the entropy") {
  qwen::Qwen2ForCausalLM model = extras_model(11);
  qwen::TrainBatch batch = extras_batch(torch::zeros({8}));
  double before = 0.0, after = 0.0;
  batch_logprobs(model, batch, &before);
  qwen::TrainOptions options;
  options.ppo_mini_batch_size = 4;
  options.extras.entropy_coeff = 1.0;
  const qwen::UpdateMetrics metrics = run_update(model, batch, options);
  CHECK(metrics.entropy == doctest::Approx(before / batch.padded.loss_mask.sum().item<double>()));
  batch_logprobs(model, batch, &after);
  CHECK(after > before);
}

TEST_CASE("the trainer: rollouts keep the sampler's log-probs, every step logs verl's metrics for them and a KL loss") {
  torch::manual_seed(0);
  qwen::Qwen2ForCausalLM model(qwen::demo_model_config());
  qwen::initialize_weights(model);
  const auto problems = qwen::make_demo_problems({.test_count = 4});
  auto options = dapo::test::demo_step_options();
  options.total_steps = 1;
  options.extras.kl_loss_coef = 0.1;
  options.extras.rollout_is = "sequence";
  options.extras.rollout_rs = "seq_mean_k3";
  options.extras.rollout_rs_threshold = "0.5";
  qwen::Trainer trainer(model, qwen::Tokenizer::byte_level({"<|endoftext|>", "<|im_start|>", "<|im_end|>"}),
                        problems.train, problems.test, options);
  const nlohmann::json row = trainer.step();
  CAPTURE(row.dump());
  // The sampler's probabilities against the training forward's: the same weights and float32 arithmetic, in other
  // GEMM shapes (one row per decode step against the whole sequence): equal within float32 rounding.
  CHECK(row.at("training/rollout_probs_diff_max").get<double>() < 1e-4);
  CHECK(row.at("training/rollout_probs_diff_mean").get<double>() <= row.at("training/rollout_probs_diff_max"));
  // Two mini-batches and two epochs: the updates after the first are off the frozen starting policy.
  CHECK(row.at("actor/kl_loss").get<double>() > 0.0);
  bool has_correction = false;
  for (const auto& [key, value] : row.items()) has_correction = has_correction || key.starts_with("rollout_corr/");
  CHECK(has_correction);
}

TEST_CASE("the update waits for the device once per optimizer update and once after them, whatever it computes") {
  // Every read of device data goes through host_door (the engine's one door): the update reads its gradient norm and
  // metrics once per optimizer update, then the old policy's entropy and the probabilities' gap once; the micro-batches
  // read nothing (their rows reach the device as copies). Rollout correction reads the old log-probs once more.
  qwen::Qwen2ForCausalLM reference = extras_model(12);
  struct Case {
    const char* name;
    std::function<void(qwen::TrainOptions&)> set;
    int64_t extra_reads;
  };
  const std::vector<Case> cases{
      {"whole groups, shared prompts, two epochs", [](qwen::TrainOptions& o) { o.ppo_epochs = 2; }, 0},
      {"each row whole, a token budget, KL loss and entropy term",
       [](qwen::TrainOptions& o) {
         o.shared_prompt = false;
         o.use_dynamic_bsz = true;
         o.ppo_max_token_len_per_gpu = 40;
         o.extras.kl_loss_coef = 0.5;
         o.extras.entropy_coeff = 0.01;
       },
       0},
      {"rollout correction",
       [](qwen::TrainOptions& o) {
         o.extras.rollout_is = "token";
         o.extras.rollout_is_threshold = "2.0";
       },
       1},
  };
  for (const Case& c : cases) {
    const std::string name = c.name;
    CAPTURE(name);
    qwen::Qwen2ForCausalLM model = extras_model(11);
    qwen::TrainBatch batch = extras_batch(kAdvantages);
    batch.rollout_logp = batch_logprobs(model, batch) - 0.01f * batch.padded.loss_mask.to(torch::kFloat32);
    qwen::TrainOptions options;
    options.ppo_mini_batch_size = 2;  // two mini-batches of two groups
    options.ppo_micro_batch_size = 1;
    c.set(options);
    const qwen::host_door::Counts before = qwen::host_door::counts();
    int64_t updates = 0;
    const qwen::UpdateMetrics metrics = run_update(model, batch, options, &reference, &updates);
    const qwen::host_door::Counts after = qwen::host_door::counts();
    REQUIRE(updates >= 2);
    CHECK(after.reads - before.reads == updates + 1 + c.extra_reads);
    CHECK(after.reads - before.reads <= 2 * updates);  // at most two per optimizer update
    CHECK(after.copies - before.copies > 0);           // the micro-batches' rows went to the device as copies
    CHECK(metrics.host_reads == after.reads - before.reads);
    CHECK(metrics.host_copies == after.copies - before.copies);
    CHECK(metrics.entropy > 0.0);
    REQUIRE(metrics.rollout_probs_diff.has_value());
    CHECK((*metrics.rollout_probs_diff)[1] > 0.0);
  }
}

TEST_CASE("under autocast the update casts each weight once per optimizer update") {
  // The no-grad passes before the first update and every micro-batch's forward and checkpointed recompute read one
  // cast of each weight matrix per optimizer update (WeightCastScope), however the rows are cut.
  for (const bool shared_prompt : {true, false}) {
    CAPTURE(shared_prompt);
    qwen::Qwen2ForCausalLM model = extras_model(11);
    qwen::TrainBatch batch = extras_batch(kAdvantages);
    batch_logprobs(model, batch);  // the fused blocks are made on the first forward
    qwen::TrainOptions options;
    options.autocast = torch::kBFloat16;
    options.gradient_checkpointing = true;
    options.shared_prompt = shared_prompt;
    options.ppo_mini_batch_size = 2;  // two mini-batches of two groups, two micro-batches each
    options.ppo_micro_batch_size = 1;
    options.ppo_epochs = 2;
    model->model->set_gradient_checkpointing(true);
    const dapo::test::WeightCastCounter counter(model->parameters());
    int64_t updates = 0;
    run_update(model, batch, options, nullptr, &updates);
    const int64_t layers = 2, matrices = 4 * layers + 1;  // q/k/v, o, gate/up and down per layer; the tied lm-head
    CHECK(updates == 4);
    if (!dapo::test::WeightCastCounter::available()) {
      MESSAGE("the casts are not counted in a build with asserts against LibTorch without (weight_casts.hpp)");
      continue;
    }
    CHECK(counter.casts() == updates * matrices);
  }
}
