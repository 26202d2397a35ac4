// The model's step path as a GPU runs it fast: q/k/v and gate/up as one product each (Hugging Face's parameters kept,
// the unfused gradients), causal attention without a mask for right-padded training rows, the lm-head and the fused
// blocks cast once per generation under autocast (a tracking allocator counts the casts), and the backend
// scaled_dot_product_attention picks for the calls a layer makes.
#include <doctest/doctest.h>
#include <torch/torch.h>

#include "qwen_gsm8k/engine/engine.hpp"
#include "qwen_gsm8k/model/autocast.hpp"
#include "qwen_gsm8k/model/fused_linear.hpp"
#include "qwen_gsm8k/model/generation.hpp"
#include "qwen_gsm8k/model/memory_tracker.hpp"
#include "qwen_gsm8k/model/weights.hpp"
#include "support/tiny_model.hpp"

namespace {

torch::Tensor unfused(const torch::Tensor& x, const std::vector<torch::Tensor>& weights,
                      const std::vector<torch::Tensor>& biases) {
  std::vector<torch::Tensor> outputs;
  for (std::size_t i = 0; i < weights.size(); ++i) {
    outputs.push_back(torch::nn::functional::linear(x, weights[i], biases[i]));
  }
  return torch::cat(outputs, -1);
}

}  // namespace

TEST_CASE("fused linears: one product over Hugging Face's parameters, with the unfused products' gradients") {
  torch::manual_seed(0);
  std::vector<torch::nn::Linear> layers{torch::nn::Linear(6, 4), torch::nn::Linear(6, 3), torch::nn::Linear(6, 2)};
  std::vector<torch::Tensor> weights, biases;  // the same values as separate leaves: the reference
  std::vector<const c10::TensorImpl*> identities;
  for (const auto& layer : layers) {
    weights.push_back(layer->weight.detach().clone().requires_grad_());
    biases.push_back(layer->bias.detach().clone().requires_grad_());
    identities.push_back(layer->weight.unsafeGetTensorImpl());
  }
  qwen::FusedLinears fused(layers);
  CHECK_FALSE(fused.fused());
  const torch::Tensor x = torch::randn({2, 5, 6}), r = torch::randn({2, 5, 9});
  const torch::Tensor y = fused.forward(x);
  REQUIRE(fused.fused());
  for (std::size_t i = 0; i < layers.size(); ++i) {  // the same parameters, now slices of one block
    CHECK(layers[i]->weight.unsafeGetTensorImpl() == identities[i]);
    CHECK(layers[i]->weight.is_leaf());
    CHECK(torch::equal(layers[i]->weight, weights[i]));
  }
  const torch::Tensor expected = unfused(x, weights, biases);
  CHECK(torch::allclose(y, expected, 1e-6, 1e-6));  // one wider product: BLAS may sum in another order
  (y * r).sum().backward();
  (expected * r).sum().backward();
  for (std::size_t i = 0; i < layers.size(); ++i) {
    CAPTURE(i);
    REQUIRE(layers[i]->weight.grad().defined());
    CHECK(torch::allclose(layers[i]->weight.grad(), weights[i].grad(), 1e-6, 1e-6));
    CHECK(torch::allclose(layers[i]->bias.grad(), biases[i].grad(), 1e-6, 1e-6));
  }

  // An in-place update (the optimizer's) stays in the block; a parameter given other memory is taken back into it.
  {
    const torch::NoGradGuard no_grad;
    layers[0]->weight.add_(1.0);
    weights[0].add_(1.0);
  }
  CHECK(fused.fused());
  CHECK(torch::allclose(fused.forward(x), unfused(x, weights, biases), 1e-6, 1e-6));
  layers[1]->weight.set_data(torch::ones({3, 6}));
  CHECK_FALSE(fused.fused());
  {
    const torch::NoGradGuard no_grad;
    weights[1].copy_(torch::ones({3, 6}));
    const torch::Tensor out = fused.forward(x);
    CHECK_FALSE(out.requires_grad());
    CHECK(torch::allclose(out, unfused(x, weights, biases), 1e-6, 1e-6));
  }
  CHECK(fused.fused());
  CHECK(layers[1]->weight.unsafeGetTensorImpl() == identities[1]);
  for (auto& layer : layers) {  // frozen layers: no graph
    for (auto& parameter : layer->parameters()) parameter.requires_grad_(false);
  }
  CHECK_FALSE(fused.forward(x).requires_grad());
  CHECK_THROWS_WITH_AS(
      qwen::FusedLinears({torch::nn::Linear(6, 4), torch::nn::Linear(torch::nn::LinearOptions(6, 2).bias(false))}),
      doctest::Contains("some layers have a bias"), std::invalid_argument);
}

TEST_CASE("model: checkpoint names and values stay Hugging Face's after the projections are fused") {
  torch::manual_seed(1);
  qwen::Qwen2ForCausalLM model(dapo::test::tiny_qwen_config(101, 48, 6, 2, 2));
  qwen::initialize_weights(model);
  std::vector<std::string> names;
  std::vector<torch::Tensor> values;
  for (const auto& item : model->named_parameters()) {
    names.push_back(item.key());
    values.push_back(item.value().detach().clone());
  }
  const torch::Tensor ids = torch::tensor({{5, 6, 7, 8}}, torch::kInt64), mask = torch::ones({1, 4}, torch::kInt64);
  model->forward(ids, mask, qwen::position_ids_from_mask(mask));
  std::size_t i = 0;
  for (const auto& item : model->named_parameters()) {
    REQUIRE(i < names.size());
    CHECK(item.key() == names[i]);
    CHECK(torch::equal(item.value(), values[i]));
    ++i;
  }
  CHECK(i == names.size());
  const auto& attention = model->model->layers->ptr<qwen::DecoderLayerImpl>(0)->self_attn;
  // q, k and v now share one block: k's weight starts where q's ends.
  CHECK(static_cast<const char*>(attention->k_proj->weight.data_ptr()) ==
        static_cast<const char*>(attention->q_proj->weight.data_ptr()) + attention->q_proj->weight.nbytes());
}

TEST_CASE("model: right-padded rows through causal attention alone get the padding mask's hidden states") {
  const torch::Tensor right = torch::tensor({{1, 1, 1, 1, 1, 1, 1}, {1, 1, 1, 1, 1, 0, 0}, {1, 1, 0, 0, 0, 0, 0}});
  const torch::Tensor left = torch::tensor({{1, 1, 1}, {0, 1, 1}});
  CHECK(qwen::right_padded(right));
  CHECK_FALSE(qwen::right_padded(left));
  CHECK_FALSE(qwen::right_padded(torch::tensor({{1, 0, 1}})));
  CHECK(qwen::right_padded(torch::tensor({{1}, {0}})));
  CHECK_THROWS_WITH_AS(qwen::right_padded(torch::ones({3})), doctest::Contains("expected [B, S]"), c10::Error);

  torch::manual_seed(2);
  qwen::Qwen2ForCausalLM model(dapo::test::tiny_qwen_config(101, 48, 6, 2, 2));
  qwen::initialize_weights(model, 0.2);
  const torch::Tensor ids = torch::randint(3, 101, {3, 7}, torch::kInt64);
  const torch::Tensor positions = qwen::position_ids_from_mask(right);
  const torch::Tensor masked = model->hidden_states(ids, right, positions);
  const torch::Tensor causal = model->right_padded_hidden_states(ids, right, positions);
  const std::vector<int64_t> lengths{7, 5, 2};
  for (int64_t row = 0; row < 3; ++row) {
    CAPTURE(row);
    const torch::Tensor a = masked[row].narrow(0, 0, lengths[static_cast<std::size_t>(row)]);
    const torch::Tensor b = causal[row].narrow(0, 0, lengths[static_cast<std::size_t>(row)]);
    if (qwen::uses_sdpa_on_cpu()) {
      CHECK(torch::allclose(a, b, 1e-5, 1e-5));  // another kernel (is_causal), its own rounding
    } else {
      CHECK(torch::equal(a, b));  // the eager products: masked keys weigh exactly 0 either way
    }
  }
}

TEST_CASE("generation: under autocast the lm-head and the fused q/k/v blocks are cast once per generation") {
  torch::manual_seed(3);
  // Sizes that make the casts' byte counts unlike any other tensor's: lm-head [101, 48] bfloat16 = 9,696 bytes,
  // a layer's q/k/v block [(6 + 2 x 2) x 8, 48] bfloat16 = 7,680 bytes.
  const qwen::Config config = dapo::test::tiny_qwen_config(101, 48, 6, 2, 2);
  qwen::Qwen2ForCausalLM model(config);
  qwen::initialize_weights(model);
  const int64_t lm_head_bytes = 101 * 48 * 2, qkv_bytes = 10 * 8 * 48 * 2, layers = 2;
  const std::vector<std::vector<int64_t>> prompts{{5, 6, 7, 8, 9, 10, 11}, {13, 14}, {15, 16, 17}};
  qwen::GenerationOptions options;
  options.max_new_tokens = 9;
  options.sampling = {.temperature = 0.0};
  qwen::generate(model, prompts, options);  // the blocks are made on the first forward, then kept
  {
    qwen::CpuMemoryTracker tracker;
    const qwen::AutocastGuard autocast(torch::kCPU, torch::kBFloat16);
    const auto out = qwen::generate(model, prompts, options);
    CHECK(out.lengths.eq(9).all().item<bool>());  // a prefill and 8 decode steps
    CHECK(tracker.allocations_of(lm_head_bytes) == 1);
    CHECK(tracker.allocations_of(qkv_bytes) == layers);
  }
  qwen::EngineOptions engine;
  engine.max_num_seqs = 3;
  engine.max_new_tokens = 9;
  engine.sampling.temperature = 1.0;
  engine.return_logprobs = true;
  std::vector<qwen::EngineRequest> requests(2);
  requests[0].prompt = prompts[0];
  requests[0].n = 2;
  requests[1].prompt = prompts[1];
  requests[1].n = 2;
  qwen::CpuMemoryTracker tracker;
  const qwen::AutocastGuard autocast(torch::kCPU, torch::kBFloat16);
  qwen::EngineStats stats;
  qwen::generate_requests(model, requests, engine, &stats);
  CHECK(stats.decode_calls >= 8);
  CHECK(tracker.allocations_of(lm_head_bytes) == 1);
  CHECK(tracker.allocations_of(qkv_bytes) == layers);
}

TEST_CASE("model: scaled_dot_product_attention takes a fused CPU kernel for the calls a layer makes (LibTorch 2.14+)") {
  const qwen::Config config = dapo::test::tiny_qwen_config(101, 64, 4, 2, 2);
  for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    CAPTURE(dtype);
    const auto options = torch::TensorOptions().dtype(dtype);
    const int64_t training = qwen::attention_backend(config, 2, 16, 16, /*masked=*/false, options);
    const int64_t decode = qwen::attention_backend(config, 4, 1, 33, /*masked=*/true, options);
    const int64_t prefill = qwen::attention_backend(config, 3, 9, 9, /*masked=*/true, options);
    if (qwen::uses_sdpa_on_cpu()) {
      // SDPBackend::flash_attention: the CPU's fused kernel, not the math fallback (0).
      CHECK(training == 1);
      CHECK(decode == 1);
      CHECK(prefill == 1);
    } else {
      MESSAGE("LibTorch ", TORCH_VERSION, ": the CPU's attention is the eager products, no SDPA backend to check");
      CHECK(training == -1);
      CHECK(decode == -1);
    }
  }
}
