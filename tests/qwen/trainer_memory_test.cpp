// The trainer's memory between phases: gradient checkpointing in the update (the same step, bit for bit), gradients
// released after every optimizer step (rollouts never hold them), and the KL reference model stored in the autocast
// dtype (its log-probs as close to float32's as autocast over float32 weights gives).
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <optional>
#include <vector>

#include "qwen_gsm8k/demo/demo.hpp"
#include "qwen_gsm8k/demo/demo_problems.hpp"
#include "qwen_gsm8k/model/autocast.hpp"
#include "qwen_gsm8k/model/model.hpp"
#include "qwen_gsm8k/model/weights.hpp"
#include "qwen_gsm8k/text/tokenizer.hpp"
#include "qwen_gsm8k/train/batch.hpp"
#include "qwen_gsm8k/train/trainer.hpp"
#include "support/tiny_model.hpp"

namespace {

struct StepResult {
  nlohmann::json row;
  std::vector<torch::Tensor> parameters;
  bool checkpointing = false;   // what the trainer set on the model
  bool gradients_held = false;  // any parameter with a gradient after the step
};

// One trainer step of the demo model from a fixed seed.
StepResult one_step(bool gradient_checkpointing, std::optional<torch::ScalarType> autocast) {
  const auto problems = qwen::make_demo_problems({.test_count = 4});
  torch::manual_seed(0);
  qwen::Qwen2ForCausalLM model(qwen::demo_model_config());
  qwen::initialize_weights(model);
  auto options = dapo::test::demo_step_options();
  options.autocast = autocast;
  options.gradient_checkpointing = gradient_checkpointing;
  options.extras.entropy_coeff = 0.01;  // a second term through the checkpointed layers
  qwen::Trainer trainer(model, qwen::Tokenizer::byte_level({"<|endoftext|>", "<|im_start|>", "<|im_end|>"}),
                        problems.train, problems.test, options);
  StepResult result;
  result.row = trainer.step();
  result.checkpointing = model->model->gradient_checkpointing();
  for (const auto& parameter : model->parameters()) {
    result.parameters.push_back(parameter.detach().clone());
    result.gradients_held = result.gradients_held || parameter.grad().defined();
  }
  return result;
}

}  // namespace

TEST_CASE("--gradient-checkpointing: the same trainer step bit for bit, float32 and bfloat16 autocast") {
  for (const auto autocast : {std::optional<torch::ScalarType>(), std::optional<torch::ScalarType>(torch::kBFloat16)}) {
    CAPTURE(autocast.has_value());
    const StepResult plain = one_step(false, autocast), checkpointed = one_step(true, autocast);
    CHECK_FALSE(plain.checkpointing);
    CHECK(checkpointed.checkpointing);
    CHECK(checkpointed.row.at("actor/pg_loss") == plain.row.at("actor/pg_loss"));
    CHECK(checkpointed.row.at("actor/grad_norm") == plain.row.at("actor/grad_norm"));
    CHECK(checkpointed.row.at("actor/entropy") == plain.row.at("actor/entropy"));
    CHECK(plain.row.at("actor/grad_norm").get<double>() > 0.0);  // the step had a gradient to compare
    REQUIRE(checkpointed.parameters.size() == plain.parameters.size());
    for (std::size_t i = 0; i < plain.parameters.size(); ++i) {
      CAPTURE(i);
      CHECK(torch::equal(checkpointed.parameters[i], plain.parameters[i]));
    }
  }
}

TEST_CASE("gradients are released after every optimizer step: the rollouts that follow hold none") {
  for (const bool checkpointing : {false, true}) {
    CAPTURE(checkpointing);
    CHECK_FALSE(one_step(checkpointing, std::nullopt).gradients_held);
  }
}

TEST_CASE(
    "the KL reference under autocast: layer weights in the autocast dtype, log-probs within autocast's own error") {
  for (const bool tied : {true, false}) {
    CAPTURE(tied);
    qwen::Config config = dapo::test::tiny_qwen_config(61, 32, 4, 2, 2);
    config.tie_word_embeddings = tied;
    torch::manual_seed(5);
    qwen::Qwen2ForCausalLM model(config);
    qwen::initialize_weights(model, 0.2);
    for (auto& parameter : model->parameters()) {  // biases too: initialize_weights leaves them at zero
      if (parameter.dim() == 1) parameter.detach().add_(torch::randn_like(parameter) * 0.1);
    }
    qwen::Qwen2ForCausalLM full = qwen::reference_policy(model, std::nullopt);
    qwen::Qwen2ForCausalLM half = qwen::reference_policy(model, torch::kBFloat16);
    int64_t half_bytes = 0, full_bytes = 0;
    for (const auto& item : half->named_parameters()) {
      CAPTURE(item.key());
      const bool layer_linear = item.key().find("_proj.") != std::string::npos;
      CHECK(item.value().dtype() == (layer_linear ? torch::kBFloat16 : torch::kFloat32));
      CHECK_FALSE(item.value().requires_grad());
      half_bytes += item.value().numel() * static_cast<int64_t>(item.value().element_size());
    }
    for (const auto& parameter : full->parameters()) {
      CHECK(parameter.dtype() == torch::kFloat32);
      full_bytes += parameter.numel() * static_cast<int64_t>(parameter.element_size());
    }
    CHECK(half_bytes < full_bytes);

    torch::manual_seed(6);
    const torch::Tensor ids = torch::randint(1, 61, {3, 20}, torch::kInt64);
    torch::Tensor attention = torch::ones({3, 20}, torch::kInt64);
    attention.narrow(0, 1, 1).narrow(1, 0, 5).zero_();  // a left-padded row
    torch::Tensor loss_mask = torch::zeros({3, 19}, torch::kBool);
    loss_mask.narrow(1, 9, 10).fill_(true);
    const torch::NoGradGuard no_grad;
    auto logprobs = [&](qwen::Qwen2ForCausalLM reference, std::optional<torch::ScalarType> autocast) {
      const qwen::AutocastGuard guard(torch::kCPU, autocast);
      return qwen::response_logprobs(reference, ids, attention, loss_mask, {}).logp;
    };
    const torch::Tensor exact = logprobs(full, std::nullopt);       // float32 throughout
    const torch::Tensor mixed = logprobs(full, torch::kBFloat16);   // what a float32 reference gives under autocast
    const torch::Tensor stored = logprobs(half, torch::kBFloat16);  // the reference as the trainer keeps it
    CHECK(exact.abs().sum().item<double>() > 0);
    // Autocast rounds every product's inputs to bfloat16 either way, but LibTorch 1.13's CPU autocast does not give a
    // linear layer over bfloat16 weights the bits it gives over float32 ones (over bfloat16 weights it equals a
    // bfloat16 product then a bias add). So the bound: the stored copy is as close to float32 as autocast over float32
    // weights is (measured here: mean deviations 0.0069 and 0.0093 against autocast's own 0.0079 and 0.0085).
    const auto deviation = [&](const torch::Tensor& logp) { return (logp - exact).abs().masked_select(loss_mask); };
    const torch::Tensor own = deviation(mixed), kept = deviation(stored);
    CAPTURE(own.mean().item<double>());
    CAPTURE(kept.mean().item<double>());
    CHECK(own.max().item<double>() > 0);  // bfloat16 did run
    CHECK(kept.mean().item<double>() <= 1.5 * own.mean().item<double>());
    CHECK(kept.max().item<double>() <= 2.0 * own.max().item<double>());
  }
}
