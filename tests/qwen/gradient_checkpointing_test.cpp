// Gradient checkpointing: the same loss and every gradient with and without it (the recomputation is the same
// arithmetic, so equal bits; float32 and bfloat16 autocast), and less tensor memory held through the backward,
// counted by the tracking allocator. An optimizer step's weight casts (WeightCastScope): one per weight however many
// micro-batches and recomputes read it, with the same gradients.
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <optional>
#include <vector>

#include "qwen_gsm8k/model/autocast.hpp"
#include "qwen_gsm8k/model/gradient_checkpointing.hpp"
#include "qwen_gsm8k/model/memory_tracker.hpp"
#include "qwen_gsm8k/model/model.hpp"
#include "support/tiny_model.hpp"
#include "support/weight_casts.hpp"

namespace {

struct Pass {
  torch::Tensor loss;
  std::vector<torch::Tensor> grads;
  int64_t held_bytes = 0;  // tensor bytes the forward left for the backward (the loss's graph)
};

// One NLL forward and backward of `model` on a left-padded batch, with the tensor bytes held between the two.
// With `fresh`, the gradients of this pass alone; without, added to those already there (a micro-batch's).
Pass forward_backward(qwen::Qwen2ForCausalLM& model, bool checkpointing, std::optional<torch::ScalarType> autocast,
                      bool fresh = true) {
  model->model->set_gradient_checkpointing(checkpointing);
  if (fresh) model->zero_grad();
  torch::manual_seed(11);
  const torch::Tensor ids = torch::randint(0, 97, {3, 64}, torch::kInt64);
  torch::Tensor mask = torch::ones({3, 64}, torch::kInt64);
  mask.index_put_({0, torch::indexing::Slice(0, 5)}, 0);  // left padding in one row
  const torch::Tensor positions = qwen::position_ids_from_mask(mask);
  Pass pass;
  std::optional<qwen::CpuMemoryTracker> tracker(std::in_place);
  const int64_t before = tracker->current_bytes();
  {
    const qwen::AutocastGuard guard(torch::kCPU, autocast);
    const torch::Tensor logits = model->forward(ids, mask, positions);
    const torch::Tensor logp = torch::log_softmax(logits.to(torch::kFloat32).narrow(1, 0, 63), -1);
    pass.loss = -logp.gather(-1, ids.narrow(1, 1, 63).unsqueeze(-1)).mean();
  }
  pass.held_bytes = tracker->current_bytes() - before;
  tracker.reset();
  pass.loss.backward();
  for (const auto& parameter : model->parameters()) pass.grads.push_back(parameter.grad().clone());
  return pass;
}

}  // namespace

TEST_CASE("gradient checkpointing gives the same loss and gradients, and holds less memory") {
  torch::manual_seed(5);
  qwen::Qwen2ForCausalLM model(dapo::test::tiny_qwen_config(97, 64, 4, 2, 4));
  for (const std::optional<torch::ScalarType> autocast :
       {std::optional<torch::ScalarType>{}, std::optional{torch::kBFloat16}}) {
    CAPTURE(autocast.has_value());
    const Pass plain = forward_backward(model, false, autocast);
    const Pass checkpointed = forward_backward(model, true, autocast);
    CHECK(torch::equal(plain.loss, checkpointed.loss));
    REQUIRE(plain.grads.size() == checkpointed.grads.size());
    for (std::size_t i = 0; i < plain.grads.size(); ++i) {
      CAPTURE(i);
      CHECK(torch::equal(plain.grads[i], checkpointed.grads[i]));
    }
    MESSAGE("tensor bytes held from the forward to the backward: " << plain.held_bytes << " plain, "
                                                                   << checkpointed.held_bytes << " checkpointed");
    CHECK(checkpointed.held_bytes < plain.held_bytes);
  }
}

TEST_CASE("checkpointed is the function itself without gradients, and a second backward is refused") {
  const torch::Tensor weight = torch::randn({4, 4}, torch::requires_grad());
  const auto run = [&](const torch::Tensor& x) { return torch::tanh(x.matmul(weight)); };
  const torch::Tensor x = torch::randn({3, 4}, torch::requires_grad());
  {
    const torch::NoGradGuard no_grad;
    const torch::Tensor out = qwen::checkpointed(run, x, {weight});
    CHECK_FALSE(out.requires_grad());
    CHECK(torch::equal(out, run(x)));
  }
  const torch::Tensor out = qwen::checkpointed(run, x, {weight});
  out.sum().backward();
  const torch::Tensor x_grad = x.grad().clone(), weight_grad = weight.grad().clone();
  x.mutable_grad().zero_(), weight.mutable_grad().zero_();
  run(x).sum().backward();
  CHECK(torch::equal(x_grad, x.grad()));
  CHECK(torch::equal(weight_grad, weight.grad()));
  CHECK_THROWS_WITH(out.sum().backward(), doctest::Contains("the backward ran twice"));
}

TEST_CASE("a WeightCastScope casts each weight once for every micro-batch and recompute, with the same gradients") {
  // Two micro-batches' forwards and backwards under bfloat16 autocast, with and without checkpointing: inside the scope
  // each weight matrix (the fused q/k/v and gate/up blocks, o_proj, down_proj and the tied lm-head) is cast once in
  // all, and every gradient keeps the bits of autocast's own casts (the tied embedding's to within float32 rounding).
  torch::manual_seed(5);
  qwen::Qwen2ForCausalLM model(dapo::test::tiny_qwen_config(97, 64, 4, 2, 4));
  const int64_t layers = 4, matrices = 4 * layers + 1;
  const auto two_micro_batches = [&](bool checkpointing, bool scope) {
    std::optional<qwen::WeightCastScope> casts;
    if (scope) casts.emplace();
    std::vector<torch::Tensor> grads;
    model->zero_grad();
    for (int micro = 0; micro < 2; ++micro)
      grads = forward_backward(model, checkpointing, torch::kBFloat16, false).grads;
    return grads;
  };
  two_micro_batches(false, false);  // the fused blocks are made on the first forward
  for (const bool checkpointing : {false, true}) {
    CAPTURE(checkpointing);
    int64_t autocast_casts = 0, scope_casts = 0;
    std::vector<torch::Tensor> autocast_grads, scope_grads;
    {
      const dapo::test::WeightCastCounter counter(model->parameters());
      autocast_grads = two_micro_batches(checkpointing, false);
      autocast_casts = counter.casts();
    }
    {
      const dapo::test::WeightCastCounter counter(model->parameters());
      scope_grads = two_micro_batches(checkpointing, true);
      scope_casts = counter.casts();
    }
    MESSAGE("weight casts for two micro-batches: " << autocast_casts << " by autocast, " << scope_casts
                                                   << " in a WeightCastScope");
    if (dapo::test::WeightCastCounter::available()) {
      CHECK(scope_casts == matrices);
      CHECK(autocast_casts >= 2 * matrices);
    } else {
      MESSAGE("the casts are not counted in a build with asserts against LibTorch without (weight_casts.hpp)");
    }
    REQUIRE(autocast_grads.size() == scope_grads.size());
    // A weight whose gradient comes by two paths: read by the embedding lookup and by the lm-head (tied).
    const torch::Tensor lookup = model->model->embed_tokens->weight, lm_head = model->lm_head_weight();
    const auto named = model->named_parameters();
    int read_twice = 0;
    for (std::size_t i = 0; i < scope_grads.size(); ++i) {
      CAPTURE(named.keys()[i]);
      if (!(named.values()[i].is_same(lookup) && named.values()[i].is_same(lm_head))) {
        CHECK(torch::equal(autocast_grads[i], scope_grads[i]));
        continue;
      }
      // The tied embedding's gradient comes by two paths, the lookup's and the lm-head's: autocast adds their sum to
      // the gradient, the scope's cast adds the lm-head's part itself (block_cast) before the lookup's AccumulateGrad
      // adds its own. The same float32 terms in another order: equal to within a float32 rounding of each sum.
      const double largest = autocast_grads[i].abs().max().item<double>();
      const double diff = (autocast_grads[i] - scope_grads[i]).abs().max().item<double>();
      MESSAGE("a weight read twice (tied): max |diff| " << diff << " of largest " << largest);
      CHECK(diff <= 2e-6 * largest);
      ++read_twice;
    }
    CHECK(read_twice == (model->config().tie_word_embeddings ? 1 : 0));
  }
}
