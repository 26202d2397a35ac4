// The training forward's fused operators (model/fused_training.hpp): each forward computes what the unfused calls
// compute, each backward equals ATen's autograd of those calls (float64: to rounding; bfloat16 under autocast's
// dtypes: within its rounding), and the model's training forward takes them under autocast with the unfused path's
// logits and gradients.
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <optional>
#include <set>
#include <string>
#include <vector>

#include "qwen_gsm8k/model/autocast.hpp"
#include "qwen_gsm8k/model/fused_ops.hpp"
#include "qwen_gsm8k/model/fused_training.hpp"
#include "qwen_gsm8k/model/model.hpp"
#include "support/tiny_model.hpp"

namespace {

using torch::Tensor;

// Leaves with gradients, of `dtype`.
Tensor leaf(std::vector<int64_t> shape, torch::ScalarType dtype) {
  return torch::randn(shape, torch::kFloat64).to(dtype).requires_grad_(true);
}

// The gradients of sum(output_i * weight_i) with respect to `inputs`, with fresh random weights per output (the same
// for both paths: seeded).
std::vector<Tensor> gradients(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs) {
  torch::manual_seed(77);
  Tensor total = torch::zeros({}, torch::kFloat64);
  for (const Tensor& output : outputs) {
    total = total + (output.to(torch::kFloat64) * torch::randn(output.sizes(), torch::kFloat64)).sum();
  }
  std::vector<Tensor> out = torch::autograd::grad({total}, inputs, {}, /*retain_graph=*/true, false,
                                                  /*allow_unused=*/true);
  return out;
}

void check_close(const Tensor& actual, const Tensor& expected, double tolerance) {
  REQUIRE(actual.defined());
  REQUIRE(expected.defined());
  CHECK(bool(actual.scalar_type() == expected.scalar_type()));
  CHECK(actual.sizes() == expected.sizes());
  const Tensor a = actual.to(torch::kFloat64), e = expected.to(torch::kFloat64);
  const double scale = std::max(1.0, e.abs().max().item<double>());
  CHECK((a - e).abs().max().item<double>() <= tolerance * scale);
}

// The names of the autograd nodes behind `output`.
std::set<std::string> node_names(const Tensor& output) {
  std::set<std::string> names;
  std::vector<torch::autograd::Node*> pending{output.grad_fn().get()};
  std::set<torch::autograd::Node*> seen;
  while (!pending.empty()) {
    torch::autograd::Node* node = pending.back();
    pending.pop_back();
    if (node == nullptr || !seen.insert(node).second) continue;
    names.insert(node->name());
    for (const auto& edge : node->next_edges()) pending.push_back(edge.function.get());
  }
  return names;
}

}  // namespace

TEST_CASE("fused training operators: the unfused calls' forward, and ATen's autograd of them as the backward") {
  torch::manual_seed(3);
  constexpr double kEps = 1e-6;

  // The norm computes in float32 whatever x's dtype (Qwen2RMSNorm's cast), where LibTorch 2.4+'s at::rms_norm (the
  // unfused path there) computes float64 in float64: float64 inputs give float32's bounds.
  SUBCASE("rms_norm_trained, float64: Qwen2RMSNorm and its gradients") {
    const Tensor x = leaf({3, 5, 16}, torch::kFloat64), weight = leaf({16}, torch::kFloat64);
    const Tensor fused = qwen::fused::rms_norm_trained(x, weight, kEps, torch::kFloat64);
    const Tensor plain = qwen::fused::rms_norm(x, weight, kEps);
    check_close(fused, plain, 1e-6);
    const auto fused_grads = gradients({fused}, {x, weight}), plain_grads = gradients({plain}, {x, weight});
    for (std::size_t i = 0; i < 2; ++i) check_close(fused_grads[i], plain_grads[i], 1e-6);
  }

  SUBCASE("add_rms_norm_trained, float64: the sum and its norm, both used after") {
    const Tensor x = leaf({4, 16}, torch::kFloat64), residual = leaf({4, 16}, torch::kFloat64);
    const Tensor weight = leaf({16}, torch::kFloat64);
    const auto [normed, sum] = qwen::fused::add_rms_norm_trained(x, residual, weight, kEps, torch::kFloat64);
    const Tensor plain_sum = residual + x;
    const Tensor plain_normed = qwen::fused::rms_norm(plain_sum, weight, kEps);
    check_close(normed, plain_normed, 1e-6);
    check_close(sum, plain_sum, 0);
    const auto fused_grads = gradients({normed, sum}, {x, residual, weight});
    const auto plain_grads = gradients({plain_normed, plain_sum}, {x, residual, weight});
    for (std::size_t i = 0; i < 3; ++i) check_close(fused_grads[i], plain_grads[i], 1e-6);
  }

  SUBCASE("add_rms_norm_trained under autocast's dtypes: bfloat16 x, float32 residual and weight, bfloat16 out") {
    const Tensor x = leaf({6, 32}, torch::kBFloat16), residual = leaf({6, 32}, torch::kFloat32);
    const Tensor weight = leaf({32}, torch::kFloat32);
    const auto [normed, sum] = qwen::fused::add_rms_norm_trained(x, residual, weight, kEps, torch::kBFloat16);
    const Tensor plain_sum = residual + x;
    // The unfused path: the norm in float32, then the next product's autocast cast.
    const Tensor plain_normed = qwen::fused::rms_norm(plain_sum, weight, kEps).to(torch::kBFloat16);
    CHECK(bool(sum.scalar_type() == torch::kFloat32));
    CHECK(torch::equal(sum, plain_sum));
    check_close(normed, plain_normed, 1e-2);
    const auto fused_grads = gradients({normed, sum}, {x, residual, weight});
    const auto plain_grads = gradients({plain_normed, plain_sum}, {x, residual, weight});
    check_close(fused_grads[0], plain_grads[0], 1e-2);  // bfloat16, as x
    check_close(fused_grads[1], plain_grads[1], 1e-5);
    check_close(fused_grads[2], plain_grads[2], 1e-5);
  }

  SUBCASE("silu_and_mul_trained: silu(gate) * up, with ATen's gradients bit for bit") {
    for (const torch::ScalarType dtype : {torch::kFloat64, torch::kFloat32, torch::kBFloat16}) {
      CAPTURE(dtype);
      const Tensor gate_up = leaf({2, 3, 24}, dtype);
      const Tensor fused = qwen::fused::silu_and_mul_trained(gate_up);
      const std::vector<Tensor> halves = gate_up.chunk(2, -1);
      const Tensor plain = torch::silu(halves[0]) * halves[1];
      CHECK(torch::equal(fused, plain));
      CHECK(torch::equal(gradients({fused}, {gate_up})[0], gradients({plain}, {gate_up})[0]));
    }
  }

  SUBCASE("rotary_qkv: RoPE on q and k, v as it is, heads first or packed, with ATen's gradients") {
    constexpr int64_t kHeads = 4, kKvHeads = 2, kDim = 8, kBatch = 2, kPositions = 5;
    constexpr int64_t kWidth = kHeads + 2 * kKvHeads;
    for (const torch::ScalarType dtype : {torch::kFloat64, torch::kBFloat16}) {
      CAPTURE(dtype);
      const Tensor cos = torch::rand({kBatch, 1, kPositions, kDim}, torch::kFloat64).to(dtype);
      const Tensor sin = torch::rand({kBatch, 1, kPositions, kDim}, torch::kFloat64).to(dtype);
      const double tolerance = dtype == torch::kFloat64 ? 1e-15 : 1e-2;
      {  // batched, heads first: [B, W, T, D] against the view, split and fused::rotary the unfused layer makes
        const Tensor product = leaf({kBatch, kPositions, kWidth * kDim}, dtype);
        const std::vector<Tensor> fused = qwen::fused::rotary_qkv_heads(product, cos, sin, kHeads, kKvHeads);
        const Tensor heads = product.view({kBatch, kPositions, kWidth, kDim}).transpose(1, 2);
        const std::vector<Tensor> qk_v = heads.split_with_sizes({kHeads + kKvHeads, kKvHeads}, 1);
        const std::vector<Tensor> plain = torch::cat({qwen::fused::rotary(qk_v[0], cos, sin), qk_v[1]}, 1)
                                              .split_with_sizes({kHeads, kKvHeads, kKvHeads}, 1);
        REQUIRE(fused.size() == 3);
        for (std::size_t i = 0; i < 3; ++i) {
          CHECK(fused[i].is_contiguous());
          CHECK(torch::equal(fused[i], plain[i]));
        }
        check_close(gradients(fused, {product})[0], gradients(plain, {product})[0], tolerance);
        // Only some of the three used: the others' gradients are zero.
        check_close(gradients({fused[0], fused[2]}, {product})[0], gradients({plain[0], plain[2]}, {product})[0],
                    tolerance);
      }
      {  // packed tokens: [T, W D] -> [T, W, D], cos [T, 1, D]
        const Tensor product = leaf({kPositions, kWidth * kDim}, dtype);
        const Tensor packed_cos = cos[0].transpose(0, 1).contiguous(), packed_sin = sin[0].transpose(0, 1).contiguous();
        const Tensor fused = qwen::fused::rotary_qkv(product, packed_cos, packed_sin, kHeads, kKvHeads);
        const std::vector<Tensor> qk_v =
            product.view({kPositions, kWidth, kDim}).split_with_sizes({kHeads + kKvHeads, kKvHeads}, 1);
        const Tensor plain = torch::cat({qwen::fused::rotary(qk_v[0], packed_cos, packed_sin), qk_v[1]}, 1);
        CHECK(torch::equal(fused, plain));
        check_close(gradients({fused}, {product})[0], gradients({plain}, {product})[0], tolerance);
      }
    }
  }

  SUBCASE("bad shapes are named") {
    CHECK_THROWS_WITH_AS(
        qwen::fused::rotary_qkv_heads(torch::ones({5, 64}), torch::ones({5, 1, 8}), torch::ones({5, 1, 8}), 4, 2),
        doctest::Contains("expected [B, T, W D]"), c10::Error);
    const Tensor weight = torch::ones({8});
    CHECK_THROWS_WITH_AS(qwen::fused::rms_norm_trained(torch::ones({2, 6}), weight, kEps, torch::kFloat32),
                         doctest::Contains("expected [..., H] and [H]"), c10::Error);
    CHECK_THROWS_WITH_AS(
        qwen::fused::add_rms_norm_trained(torch::ones({2, 8}), torch::ones({3, 8}), weight, kEps, torch::kFloat32),
        doctest::Contains("residual"), c10::Error);
    CHECK_THROWS_WITH_AS(qwen::fused::rotary_qkv_heads(torch::ones({2, 5, 40}), torch::ones({2, 1, 5, 4}),
                                                       torch::ones({2, 1, 5, 4}), 4, 2),
                         doctest::Contains("heads of an even dimension"), c10::Error);
    CHECK_THROWS_WITH_AS(qwen::fused::rotary_qkv_heads(torch::ones({2, 5, 64}), torch::ones({2, 1, 4, 8}),
                                                       torch::ones({2, 1, 4, 8}), 4, 2),
                         doctest::Contains("must be contiguous with 2 x 5 x 8 elements"), c10::Error);
  }
}

TEST_CASE(
    "model: under autocast the training forward takes the fused operators, with the unfused logits and "
    "gradients within bfloat16's rounding") {
  torch::manual_seed(5);
  qwen::Qwen2ForCausalLM model(dapo::test::tiny_qwen_config(97, 64, 4, 2, 2));
  const Tensor ids = torch::randint(0, 97, {2, 12}, torch::kInt64);
  Tensor mask = torch::ones({2, 12}, torch::kInt64);
  mask.index_put_({1, torch::indexing::Slice(0, 3)}, 0);  // left padding in one row
  const Tensor positions = qwen::position_ids_from_mask(mask);
  const auto pass = [&](bool fused) {
    std::optional<qwen::fused::UnfusedTraining> unfused;
    if (!fused) unfused.emplace();
    model->zero_grad();
    Tensor logits;
    {
      const qwen::AutocastGuard guard(torch::kCPU, torch::kBFloat16);
      CHECK(qwen::fused::uses_fused_training(ids) == fused);
      logits = model->forward(ids, mask, positions).to(torch::kFloat32);
    }
    const std::set<std::string> nodes = node_names(logits);
    for (const char* name :
         {"qwen::RmsNormBackward", "qwen::AddRmsNormBackward", "qwen::RotaryQkvBackward", "qwen::SiluAndMulBackward"}) {
      CAPTURE(name);
      CHECK(nodes.count(name) == (fused ? 1 : 0));
    }
    torch::manual_seed(9);
    (logits * torch::randn(logits.sizes())).sum().backward();
    std::vector<Tensor> grads{logits.detach()};
    for (const auto& parameter : model->parameters()) grads.push_back(parameter.grad().clone());
    return grads;
  };
  const std::vector<Tensor> fused = pass(true), plain = pass(false);
  REQUIRE(fused.size() == plain.size());
  for (std::size_t i = 0; i < fused.size(); ++i) {
    CAPTURE(i);
    check_close(fused[i], plain[i], 3e-2);
  }
}
