// The model's step path as a GPU runs it fast: q/k/v and gate/up as one product each (Hugging Face's parameters kept,
// the unfused gradients), causal attention without a mask for right-padded training rows, the lm-head and the fused
// blocks cast once per generation under autocast (a tracking allocator counts the casts), and the backend
// scaled_dot_product_attention picks for the calls a layer makes.
#include <ATen/record_function.h>
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <limits>
#include <map>
#include <mutex>
#include <string>

#include "qwen_gsm8k/engine/engine.hpp"
#include "qwen_gsm8k/engine/generate.hpp"
#include "qwen_gsm8k/model/autocast.hpp"
#include "qwen_gsm8k/model/fused_linear.hpp"
#include "qwen_gsm8k/model/fused_ops.hpp"
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

// Counts the calls of operators named qwen::* (the fused operators) on every thread while an instance lives.
class FusedOpCounter {
 public:
  FusedOpCounter() {
    at::enableRecordFunction(true);
    handle_ = at::addGlobalCallback(
        at::RecordFunctionCallback(&FusedOpCounter::start).scopes({at::RecordScope::FUNCTION}).needsInputs(false));
    const std::lock_guard<std::mutex> lock(mutex());
    counts().clear();
  }
  ~FusedOpCounter() { at::removeCallback(handle_); }
  FusedOpCounter(const FusedOpCounter&) = delete;
  FusedOpCounter& operator=(const FusedOpCounter&) = delete;
  int64_t calls(const std::string& name) const {
    const std::lock_guard<std::mutex> lock(mutex());
    const auto found = counts().find(name);
    return found == counts().end() ? 0 : found->second;
  }

 private:
  static std::unique_ptr<at::ObserverContext> start(const at::RecordFunction& call) {
    const std::string name = call.name();
    if (name.rfind("qwen::", 0) == 0) {
      const std::lock_guard<std::mutex> lock(mutex());
      ++counts()[name];
    }
    return nullptr;
  }
  static std::mutex& mutex() {
    static std::mutex value;
    return value;
  }
  static std::map<std::string, int64_t>& counts() {
    static std::map<std::string, int64_t> value;
    return value;
  }
  at::CallbackHandle handle_;
};

// Hugging Face's rotate_half: (-x2, x1).
torch::Tensor rotate_half(const torch::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

}  // namespace

TEST_CASE("fused operators: each computes the formula it replaces, and the cache write touches only its positions") {
  torch::manual_seed(5);
  const torch::NoGradGuard no_grad;
  SUBCASE("add_rms_norm: the sum, and Qwen2RMSNorm of it") {
    const torch::Tensor x = torch::randn({3, 5, 8}), residual = torch::randn({3, 5, 8}), weight = torch::randn({8});
    const auto [normed, sum] = qwen::fused::add_rms_norm(x, residual, weight, 1e-6);
    CHECK(torch::equal(sum, x + residual));
    const torch::Tensor expected = weight * (sum * torch::rsqrt(sum.pow(2).mean(-1, true) + 1e-6));
    CHECK(torch::allclose(normed, expected, 1e-6, 1e-6));
    // bfloat16: the sum stored in bfloat16, normalised in float32, cast back before the weight.
    const auto b = [](const torch::Tensor& t) { return t.to(torch::kBFloat16); };
    const auto [normed16, sum16] = qwen::fused::add_rms_norm(b(x), b(residual), b(weight), 1e-6);
    CHECK((sum16.scalar_type() == torch::kBFloat16));
    CHECK(torch::equal(sum16, b(x) + b(residual)));
    const torch::Tensor wide = sum16.to(torch::kFloat32);
    const torch::Tensor expected16 = b(weight) * b(wide * torch::rsqrt(wide.pow(2).mean(-1, true) + 1e-6));
    CHECK(torch::allclose(normed16.to(torch::kFloat32), expected16.to(torch::kFloat32), 1e-2, 1e-2));
  }
  SUBCASE("silu_and_mul: silu of the first half times the second") {
    const torch::Tensor gate_up = torch::randn({2, 3, 12});
    const torch::Tensor out = qwen::fused::silu_and_mul(gate_up);
    const torch::Tensor gate = gate_up.narrow(-1, 0, 6), up = gate_up.narrow(-1, 6, 6);
    CHECK(out.sizes() == torch::IntArrayRef({2, 3, 6}));
    CHECK(torch::allclose(out, gate * torch::sigmoid(gate) * up, 1e-6, 1e-6));
  }
  SUBCASE("rope_and_cache: rotate-half RoPE on q and k, k and v written at each row's slot and position") {
    const int64_t rows = 3, heads = 4, kv_heads = 2, dim = 8, slots = 5, capacity = 7;
    const torch::Tensor qkv = torch::randn({rows, 1, (heads + 2 * kv_heads) * dim});
    const torch::Tensor angles = torch::randn({rows, 1, 1, dim / 2}).repeat({1, 1, 1, 2});
    const torch::Tensor cos = angles.cos(), sin = angles.sin();
    const torch::Tensor signed_sin = torch::cat({-sin.narrow(-1, 0, dim / 2), sin.narrow(-1, dim / 2, dim / 2)}, -1);
    const torch::Tensor keys = torch::zeros({slots, kv_heads, capacity, dim});
    const torch::Tensor values = torch::zeros({slots, kv_heads, capacity, dim});
    const torch::Tensor slot = torch::tensor({4, 0, 2}, torch::kInt64);
    const torch::Tensor position = torch::tensor({2, 0, 6}, torch::kInt64);
    const torch::Tensor query =
        qwen::fused::rope_and_cache(qkv, cos, signed_sin, keys, values, slot, position, heads, kv_heads);
    const torch::Tensor split = qkv.view({rows, heads + 2 * kv_heads, 1, dim});  // [R, N + 2 KV, 1, D]
    const auto rope = [&](const torch::Tensor& x) { return x * cos + rotate_half(x) * sin; };
    CHECK(query.sizes() == torch::IntArrayRef({rows, heads, 1, dim}));
    CHECK(torch::allclose(query, rope(split.narrow(1, 0, heads)), 1e-6, 1e-6));
    const torch::Tensor rotated_keys = rope(split.narrow(1, heads, kv_heads)).squeeze(2);  // [R, KV, D]
    const torch::Tensor new_values = split.narrow(1, heads + kv_heads, kv_heads).squeeze(2);
    torch::Tensor written = torch::zeros({slots, capacity}, torch::kBool);
    for (int64_t r = 0; r < rows; ++r) {
      CAPTURE(r);
      const int64_t s = slot[r].item<int64_t>(), p = position[r].item<int64_t>();
      CHECK(torch::allclose(keys.select(0, s).select(1, p), rotated_keys[r], 1e-6, 1e-6));
      CHECK(torch::equal(values.select(0, s).select(1, p), new_values[r]));
      written[s][p] = true;
    }
    const torch::Tensor untouched = (~written).view({slots, 1, capacity, 1});
    CHECK(keys.masked_select(untouched).abs().sum().item<double>() == 0.0);
    CHECK(values.masked_select(untouched).abs().sum().item<double>() == 0.0);
    // Two positions per row is not a decode step: refused, naming the operator and the shape it expects.
    CHECK_THROWS_WITH(qwen::fused::rope_and_cache(torch::randn({rows, 2, (heads + 2 * kv_heads) * dim}), cos,
                                                  signed_sin, keys, values, slot, position, heads, kv_heads),
                      doctest::Contains("qwen::rope_and_cache: qkv has shape"));
  }
  SUBCASE("sample_tokens: the argmax or the inverse CDF at each row's uniform, and log softmax(x / T) of the token") {
    const int64_t rows = 6, vocab = 50;
    torch::Tensor logits = torch::randn({rows, vocab}) * 3;
    logits[2].narrow(0, 40, 10).fill_(-std::numeric_limits<float>::infinity());  // a tail of probability 0
    logits[2][39] = 0.0;  // its last positive probability well above 2^-23
    const torch::Tensor uniforms = torch::tensor({0.0F, 0.1F, 1.0F - 0x1.0p-23F, 0.5F, 0.77F, 0.999F});
    for (const double temperature : {1.0, 0.7}) {
      CAPTURE(temperature);
      const torch::Tensor x = logits.to(torch::kFloat64) / temperature;
      const torch::Tensor logp = x.log_softmax(-1);
      // The reference draw in float64: the first token whose cumulative probability exceeds u.
      const torch::Tensor cdf = logp.exp().cumsum(-1);
      const auto [token, logprob] = qwen::fused::sample_tokens(logits, uniforms, temperature);
      const auto [greedy, greedy_logprob] = qwen::fused::sample_tokens(logits, torch::Tensor(), temperature);
      CHECK((token.scalar_type() == torch::kInt64 && logprob.scalar_type() == torch::kFloat32));
      CHECK(torch::equal(greedy, logits.argmax(-1)));
      for (int64_t r = 0; r < rows; ++r) {
        CAPTURE(r);
        const double u = uniforms[r].item<double>();
        const int64_t expected = (cdf[r] > u * cdf[r][vocab - 1].item<double>()).nonzero()[0].item<int64_t>();
        CHECK(token[r].item<int64_t>() == expected);
        CHECK(logprob[r].item<double>() == doctest::Approx(logp[r][expected].item<double>()).epsilon(1e-5));
        CHECK(greedy_logprob[r].item<double>() == doctest::Approx(logp[r][greedy[r]].item<double>()).epsilon(1e-5));
      }
      CHECK(token[0].item<int64_t>() == 0);   // u = 0: the first token
      CHECK(token[2].item<int64_t>() == 39);  // the largest uniform: the last token of positive probability
    }
    // bfloat16 logits are read as they are: the same tokens as their float32 values, no cast before the call.
    const torch::Tensor narrow_logits = logits.to(torch::kBFloat16);
    const auto [token16, logprob16] = qwen::fused::sample_tokens(narrow_logits, uniforms, 1.0);
    const auto [token32, logprob32] = qwen::fused::sample_tokens(narrow_logits.to(torch::kFloat32), uniforms, 1.0);
    CHECK(torch::equal(token16, token32));
    CHECK(torch::equal(logprob16, logprob32));
    CHECK_THROWS_WITH(qwen::fused::sample_tokens(logits, uniforms.to(torch::kFloat64), 1.0),
                      doctest::Contains("qwen::sample_tokens: uniforms have shape [6], expected [6] float32"));
    CHECK_THROWS_WITH(qwen::fused::sample_tokens(logits, uniforms, 0.0),
                      doctest::Contains("qwen::sample_tokens: temperature is 0"));
  }
}

TEST_CASE("generation: the layers run the fused operators, which give the unfused path's bits on the CPU") {
  torch::manual_seed(11);
  const qwen::Config config = dapo::test::tiny_qwen_config(97, 32, 4, 2, 3);
  qwen::Qwen2ForCausalLM model(config);
  qwen::initialize_weights(model);
  const torch::Tensor ids = torch::randint(97, {2, 6}, torch::kInt64);
  const torch::Tensor mask = torch::tensor({{0, 1, 1, 1, 1, 1}, {1, 1, 1, 1, 1, 1}}, torch::kInt64);
  const torch::Tensor positions = qwen::position_ids_from_mask(mask);
  // With gradients the layers take the training path (no fused operator); without, the generation path.
  const auto prefill = [&](bool gradients) {
    const torch::AutoGradMode mode(gradients);
    qwen::KVCache cache(config, 2, 8, torch::TensorOptions());
    return model->model->forward(ids, mask, positions, &cache).detach();
  };
  const int64_t layers = config.num_hidden_layers;
  torch::Tensor unfused_hidden, fused_hidden;
  {
    const FusedOpCounter counter;
    unfused_hidden = prefill(true);
    CHECK(counter.calls("qwen::add_rms_norm") == 0);
  }
  {
    const FusedOpCounter counter;
    fused_hidden = prefill(false);
    CHECK(counter.calls("qwen::add_rms_norm") == 2 * layers);  // each residual add with the norm after it
    CHECK(counter.calls("qwen::silu_and_mul") == layers);
    CHECK(counter.calls("qwen::rope_and_cache") == 0);  // a prefill's cache has no fused write
  }
  CHECK(torch::equal(fused_hidden, unfused_hidden));

  // The engine's decode steps: RoPE and the cache write as one operator per layer and step.
  qwen::EngineOptions engine;
  engine.max_num_seqs = 2;
  engine.max_new_tokens = 5;
  engine.sampling.temperature = 0.0;
  std::vector<qwen::EngineRequest> requests(1);
  requests[0].prompt = {3, 4, 5};
  requests[0].n = 2;
  const FusedOpCounter counter;
  qwen::EngineStats stats;
  qwen::generate_requests(model, requests, engine, &stats);
  REQUIRE(stats.decode_calls > 0);
  CHECK(counter.calls("qwen::rope_and_cache") == layers * stats.decode_calls);
}

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
