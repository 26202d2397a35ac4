// The shared-prompt forward (each group's prompt computed once in the update): its log-probs and entropy equal each
// row's own forward, and the update's loss and gradient equal the unshared path's, for every loss and aggregation,
// with whole-group and token-budget micro-batches, gradient checkpointing, a KL loss and an entropy term.
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <dapo/loss.hpp>

#include <stdexcept>
#include <string>
#include <vector>

#include "qwen_gsm8k/model/autocast.hpp"
#include "qwen_gsm8k/model/varlen_attention.hpp"
#include "qwen_gsm8k/model/weights.hpp"
#include "qwen_gsm8k/train/batch.hpp"
#include "qwen_gsm8k/train/update.hpp"
#include "support/tiny_model.hpp"
#include "support/update_step.hpp"

namespace {

constexpr int64_t kGroupSize = 4;

// Three groups of four responses: prompts of 5, 8 and 3 tokens, responses of 1 to 9 tokens (a one-token response is
// predicted from the prompt's last position alone), the fourth row of the second group out of the loss (a truncated
// response with mask_truncated). Groups 0 and 2 share their prompt's first three tokens: only whole prompts are shared.
qwen::TrainBatch shared_batch() {
  const std::vector<std::vector<int64_t>> prompts{{3, 17, 29, 5, 11}, {7, 2, 41, 13, 19, 23, 31, 37}, {3, 17, 29}};
  std::vector<qwen::BatchRow> rows;
  for (int64_t g = 0; g < 3; ++g) {
    for (int64_t r = 0; r < kGroupSize; ++r) {
      qwen::BatchRow row{prompts[static_cast<std::size_t>(g)],
                         static_cast<int64_t>(prompts[static_cast<std::size_t>(g)].size()), !(g == 1 && r == 3)};
      const int64_t response = 1 + (g * 5 + r * 3) % 9;
      for (int64_t t = 0; t < response; ++t) row.tokens.push_back((g * 11 + r * 7 + t * 5) % 46 + 1);
      rows.push_back(std::move(row));
    }
  }
  return qwen::TrainBatch{
      qwen::pad_rows(rows, 0),
      torch::tensor({1.0f, -1.0f, 0.5f, -0.5f, 1.5f, -0.25f, 0.75f, -2.0f, 0.2f, -0.6f, 1.1f, -0.7f}),
      {},
      3,
      kGroupSize};
}

qwen::Qwen2ForCausalLM tiny_model() {
  torch::manual_seed(11);
  qwen::Qwen2ForCausalLM model(dapo::test::tiny_qwen_config(48, 32, 4, 2, 2));
  qwen::initialize_weights(model, 0.2);
  return model;
}

struct Logprobs {
  torch::Tensor logp, entropy;  // [B, L - 1], 0 outside the loss mask
  double entropy_sum = 0.0;
  std::vector<torch::Tensor> gradients;  // of sum(logp * weights) + sum(entropy)
};

// Both paths' log-probs of the whole batch, with the gradient of a weighted sum of them and of the entropy.
Logprobs logprobs_of(qwen::Qwen2ForCausalLM& model, const qwen::TrainBatch& batch, bool shared,
                     const qwen::LogprobOptions& options = {}) {
  const qwen::PaddedBatch& padded = batch.padded;
  qwen::LogprobOptions with_entropy = options;
  with_entropy.with_entropy = true;
  const qwen::TargetLogprobs values =
      shared ? qwen::shared_prompt_response_logprobs(model, padded.input_ids, padded.attention_mask, padded.loss_mask,
                                                     padded.prompt_lengths, with_entropy)
             : qwen::response_logprobs(model, padded.input_ids, padded.attention_mask, padded.loss_mask, with_entropy);
  Logprobs out;
  out.logp = values.logp;
  out.entropy = values.entropy;
  out.entropy_sum = values.entropy_sum.item<double>();
  model->zero_grad();
  const torch::Tensor weights = torch::arange(out.logp.numel(), torch::kFloat32).view(out.logp.sizes()).sin();
  ((out.logp * weights.to(out.logp.scalar_type())).sum() + out.entropy.sum()).backward();
  for (const auto& parameter : model->parameters()) out.gradients.push_back(parameter.grad().clone());
  return out;
}

// |a - b| <= bound * max(|b|, floor) element for element.
void check_close(const torch::Tensor& a, const torch::Tensor& b, double bound, double floor = 1.0) {
  const double scale = std::max(b.abs().max().item<double>(), floor);
  CHECK((a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>() <= bound * scale);
}

qwen::TrainOptions shared_options() {
  qwen::TrainOptions options;
  options.train_batch_size = 3;
  options.rollout_n = kGroupSize;
  options.ppo_mini_batch_size = 3;  // one mini-batch of the three groups
  options.ppo_micro_batch_size = 3;
  options.grad_clip = 1e9;  // no clipping: the raw gradients are compared
  options.loss.group_size = kGroupSize;
  options.loss.dro_beta = 0.1;
  return options;
}

// The update with and without the shared-prompt forward: the same loss, entropy and gradient within float32 rounding.
void check_shared_update(qwen::TrainOptions options, qwen::Qwen2ForCausalLM* reference = nullptr) {
  options.shared_prompt = false;
  const dapo::test::UpdateResult own = dapo::test::run_update_step(options, shared_batch(), reference);
  options.shared_prompt = true;
  const dapo::test::UpdateResult shared = dapo::test::run_update_step(options, shared_batch(), reference);
  REQUIRE(own.updates == shared.updates);
  CHECK(shared.metrics.loss == doctest::Approx(own.metrics.loss).epsilon(1e-5).scale(1e-6));
  CHECK(shared.metrics.entropy == doctest::Approx(own.metrics.entropy).epsilon(1e-5));
  CHECK(shared.metrics.grad_norm == doctest::Approx(own.metrics.grad_norm).epsilon(1e-4));
  CHECK(own.metrics.grad_norm > 0.0);
  dapo::test::check_same_step(shared, own);
}

}  // namespace

TEST_CASE("shared prompt: each distinct prompt once, every response row after it") {
  const qwen::TrainBatch batch = shared_batch();
  const qwen::PaddedBatch& padded = batch.padded;
  const qwen::SharedPromptBatch shared =
      qwen::shared_prompt_batch(padded.input_ids, padded.attention_mask, padded.prompt_lengths);
  // Three prompts (groups 0 and 2 share a beginning, not the prompt), padded to the longest; twelve responses of at
  // most 9 tokens. The shared forward's per-token work: 5 + 8 + 3 prompt tokens and 54 response tokens, 70 where each
  // row's own forward computes 12 x 17 = 204 positions (118 of them real).
  CHECK(shared.prompt_ids.sizes() == torch::IntArrayRef{3, 8});
  CHECK(torch::equal(shared.prompt_lengths, torch::tensor({5, 8, 3}, torch::kInt64)));
  CHECK(torch::equal(shared.row_prompt, torch::tensor({0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2}, torch::kInt64)));
  CHECK(shared.response_ids.sizes() == torch::IntArrayRef{12, 9});
  CHECK(torch::equal(shared.response_lengths, torch::tensor({1, 4, 7, 1, 6, 9, 3, 6, 2, 5, 8, 2}, torch::kInt64)));
  CHECK(padded.input_ids.sizes() == torch::IntArrayRef{12, 17});
  for (int64_t b = 0; b < 12; ++b) {
    CAPTURE(b);
    const int64_t prompt = padded.prompt_lengths[static_cast<std::size_t>(b)];
    const int64_t length = padded.attention_mask[b].sum().item<int64_t>();
    const int64_t p = shared.row_prompt[b].item<int64_t>();
    CHECK(torch::equal(shared.prompt_ids[p].narrow(0, 0, prompt), padded.input_ids[b].narrow(0, 0, prompt)));
    CHECK(torch::equal(shared.response_ids[b].narrow(0, 0, length - prompt),
                       padded.input_ids[b].narrow(0, prompt, length - prompt)));
  }
}

TEST_CASE("shared prompt: log-probs, entropy and their gradients equal each row's own forward") {
  const qwen::TrainBatch batch = shared_batch();
  for (const bool checkpointing : {false, true}) {
    CAPTURE(checkpointing);
    qwen::Qwen2ForCausalLM model = tiny_model();
    model->model->set_gradient_checkpointing(checkpointing);
    const Logprobs own = logprobs_of(model, batch, false);
    const Logprobs shared = logprobs_of(model, batch, true);
    // Zero outside the loss mask on both paths, and every target has a value.
    CHECK(shared.logp.masked_select(~batch.padded.loss_mask).abs().max().item<double>() == 0.0);
    CHECK(shared.logp.masked_select(batch.padded.loss_mask).lt(0.0).all().item<bool>());
    // float32 sums in another order (other widths, the prompt's K/V gathered per row): 1e-5 of the largest value.
    check_close(shared.logp, own.logp, 1e-5);
    check_close(shared.entropy, own.entropy, 1e-5);
    CHECK(shared.entropy_sum == doctest::Approx(own.entropy_sum).epsilon(1e-5));
    REQUIRE(shared.gradients.size() == own.gradients.size());
    for (std::size_t i = 0; i < own.gradients.size(); ++i) {
      CAPTURE(i);
      check_close(shared.gradients[i], own.gradients[i], 1e-4, 1e-6);
    }
  }
}

TEST_CASE("shared prompt: the packed layout's sequences are each prompt, then each response row after its prompt") {
  // Prompts of 2 and 3 tokens (packed tokens 0-1, 2-4); responses of 1, 0 and 2 tokens continuing prompts 1, 0, 1
  // (tokens 5, none, 6-7). The empty response is no sequence; each response's keys are its prompt's, then its own.
  const qwen::VarlenLayout layout = qwen::shared_prompt_layout({2, 3}, {1, 0, 2}, {1, 0, 1});
  CHECK(layout.key_tokens == std::vector<int64_t>{0, 1, 2, 3, 4, 2, 3, 4, 5, 2, 3, 4, 6, 7});
  CHECK(layout.query_starts == std::vector<int64_t>{0, 2, 5, 6, 8});
  CHECK(layout.key_starts == std::vector<int64_t>{0, 2, 5, 9, 14});
  CHECK(layout.max_queries == 3);
  CHECK(layout.max_keys == 5);
  CHECK_THROWS_WITH(qwen::shared_prompt_layout({2}, {1}, {1}), doctest::Contains("response 0 continues prompt 1 of 1"));
  CHECK_THROWS_WITH(qwen::shared_prompt_layout({0}, {}, {}), doctest::Contains("a prompt of 0 tokens"));
}

TEST_CASE("shared prompt: attention over the packed tokens (no padding, no mask) gives the masked path's values") {
  // The layout FlashAttention's variable-length call takes on CUDA, run here through its float32 reference: the same
  // log-probs, entropy and gradients as the padded rows with a mask, and as each row's own forward.
  const qwen::TrainBatch batch = shared_batch();
  for (const bool checkpointing : {false, true}) {
    CAPTURE(checkpointing);
    qwen::Qwen2ForCausalLM model = tiny_model();
    model->model->set_gradient_checkpointing(checkpointing);
    const auto shared_with = [&](qwen::SharedAttention attention) {
      const qwen::SharedAttentionChoice choice(attention);
      return logprobs_of(model, batch, true);
    };
    const Logprobs masked = shared_with(qwen::SharedAttention::kMasked);
    const Logprobs packed = shared_with(qwen::SharedAttention::kReference);
    const Logprobs own = logprobs_of(model, batch, false);
    check_close(packed.logp, masked.logp, 1e-5);
    check_close(packed.logp, own.logp, 1e-5);
    check_close(packed.entropy, masked.entropy, 1e-5);
    REQUIRE(packed.gradients.size() == masked.gradients.size());
    for (std::size_t i = 0; i < masked.gradients.size(); ++i) {
      CAPTURE(i);
      check_close(packed.gradients[i], masked.gradients[i], 1e-4, 1e-6);
    }
  }
  // The kernel itself runs on CUDA alone (cuda_test compares it with the masked path there).
  CHECK_FALSE(qwen::varlen_attention_usable(torch::Device(torch::kCPU), torch::kBFloat16, 4, 2, 8));
}

TEST_CASE("shared prompt: under bfloat16 autocast, within bfloat16's rounding") {
  const qwen::TrainBatch batch = shared_batch();
  // bfloat16 products (8 bits of mantissa) summed in another order: a few of its ulps of the largest log-prob.
  qwen::Qwen2ForCausalLM float_model = tiny_model();
  const qwen::LogprobOptions autocast{.autocast = torch::kBFloat16};
  const Logprobs own_bf16 = logprobs_of(float_model, batch, false, autocast);
  const Logprobs shared_bf16 = logprobs_of(float_model, batch, true, autocast);
  check_close(shared_bf16.logp, own_bf16.logp, 3e-2);
  const Logprobs own_f32 = logprobs_of(float_model, batch, false);
  check_close(shared_bf16.logp, own_f32.logp, 1e-1);
  CHECK((own_bf16.logp - own_f32.logp).abs().max().item<double>() > 0.0);  // autocast did act
}

TEST_CASE("shared prompt: rows that are not right-padded, or a loss target in the prompt, are refused by row") {
  qwen::TrainBatch batch = shared_batch();
  qwen::Qwen2ForCausalLM model = tiny_model();
  const qwen::PaddedBatch& padded = batch.padded;
  const auto call = [&](const torch::Tensor& attention, const torch::Tensor& loss_mask,
                        const std::vector<int64_t>& lengths) {
    const torch::NoGradGuard no_grad;
    qwen::shared_prompt_response_logprobs(model, padded.input_ids, attention, loss_mask, lengths, {});
  };
  torch::Tensor inside = padded.loss_mask.clone();
  inside[5][1] = true;  // row 5's prompt has 8 tokens: position 1 predicts prompt token 2
  CHECK_THROWS_WITH_AS(call(padded.attention_mask, inside, padded.prompt_lengths),
                       doctest::Contains("row 5 has a loss target at 2, outside its response"), std::invalid_argument);
  torch::Tensor gap = padded.attention_mask.clone();
  gap[2][1] = 0;
  CHECK_THROWS_WITH_AS(call(gap, padded.loss_mask, padded.prompt_lengths),
                       doctest::Contains("row 2 has a real token after padding"), std::invalid_argument);
  std::vector<int64_t> lengths = padded.prompt_lengths;
  lengths[7] = 40;
  CHECK_THROWS_WITH_AS(call(padded.attention_mask, padded.loss_mask, lengths),
                       doctest::Contains("row 7 has a prompt of 40 tokens"), std::invalid_argument);
  lengths.pop_back();
  CHECK_THROWS_WITH_AS(call(padded.attention_mask, padded.loss_mask, lengths),
                       doctest::Contains("11 prompt lengths for 12 rows"), std::invalid_argument);
}

TEST_CASE("shared prompt: the update's loss and gradient equal the unshared path's for every loss and aggregation") {
  int64_t compared = 0;
  for (const auto& [aggregation, aggregation_name] : dapo::kAggregationNames) {
    for (const auto& [mode, mode_name] : dapo::kPolicyLossNames) {
      CAPTURE(aggregation_name);
      CAPTURE(mode_name);
      qwen::TrainOptions options = shared_options();
      options.loss.aggregation = aggregation;
      options.loss.mode = mode;
      try {
        options.validate();
      } catch (const std::invalid_argument&) {  // kl_cov and clip_cov: the driver refuses them (per-call token choice)
        continue;
      }
      check_shared_update(options);
      ++compared;
    }
  }
  // Every loss the driver offers (all but kl_cov and clip_cov) with every aggregation.
  CHECK(compared >= static_cast<int64_t>((dapo::kPolicyLossNames.size() - 2) * dapo::kAggregationNames.size()));
}

TEST_CASE("shared prompt: with token-budget and one-group micro-batches, two epochs, checkpointing, KL and entropy") {
  torch::manual_seed(9);
  qwen::Qwen2ForCausalLM reference(dapo::test::tiny_qwen_config(48, 32, 4, 2, 2));
  qwen::initialize_weights(reference, 0.2);
  qwen::TrainOptions options = shared_options();
  options.extras.entropy_coeff = 0.01;
  options.extras.kl_loss_coef = 0.05;
  SUBCASE("one group per micro-batch, two epochs") {
    options.ppo_micro_batch_size = 1;
    options.ppo_epochs = 2;
    check_shared_update(options, &reference);
  }
  SUBCASE("token budget: groups split across micro-batches") {
    options.use_dynamic_bsz = true;
    options.ppo_max_token_len_per_gpu = 40;
    options.log_prob_max_token_len_per_gpu = 60;
    const auto plan = qwen::plan_mini_batches(shared_batch(), qwen::MicroBatching::from(options), 0, 3);
    REQUIRE(plan[0].micro_batches.size() > 2);
    check_shared_update(options, &reference);
  }
  SUBCASE("gradient checkpointing") {
    options.gradient_checkpointing = true;
    check_shared_update(options, &reference);
  }
}
