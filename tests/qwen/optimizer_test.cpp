// ClippedAdamW (train/optimizer.hpp) against what it replaces: torch::nn::utils::clip_grad_norm_ then
// torch::optim::AdamW's step, skipped when the norm is not finite. On LibTorch 1.13 it runs the same calls, so the
// results are the same bits; on 2.4 and later ATen's fused kernels order the float32 arithmetic their own way, so the
// results agree within float32 rounding.
#include <doctest/doctest.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "qwen_gsm8k/model/host_door.hpp"
#include "qwen_gsm8k/train/optimizer.hpp"

namespace {

// Parameters of a few shapes (a matrix, a vector, a scalar), as leaves.
std::vector<torch::Tensor> make_parameters() {
  torch::manual_seed(3);
  return {torch::randn({7, 5}).requires_grad_(), torch::randn({11}).requires_grad_(),
          torch::randn({}).requires_grad_()};
}

std::vector<torch::Tensor> copies(const std::vector<torch::Tensor>& parameters) {
  std::vector<torch::Tensor> out;
  for (const auto& parameter : parameters) out.push_back(parameter.detach().clone().requires_grad_());
  return out;
}

// Step `step`'s gradients, the same for every copy: scaled so that some steps are clipped and some are not.
void set_gradients(const std::vector<torch::Tensor>& parameters, int step, float poison = 0.0f) {
  torch::manual_seed(100 + step);
  const double scale = step % 2 == 0 ? 3.0 : 0.05;
  for (const auto& parameter : parameters) parameter.mutable_grad() = torch::randn(parameter.sizes()) * scale;
  if (poison != 0.0f) parameters[1].mutable_grad().select(0, 2).fill_(poison);
}

torch::optim::AdamWOptions options() {
  return torch::optim::AdamWOptions(1e-2).betas({0.9, 0.99}).eps(1e-8).weight_decay(0.1);
}

// The reference update: clip_grad_norm_, then AdamW's step when the norm is finite.
double reference_step(torch::optim::AdamW& optimizer, const std::vector<torch::Tensor>& parameters, double max_norm) {
  const double norm = torch::nn::utils::clip_grad_norm_(parameters, max_norm);
  if (std::isfinite(norm)) optimizer.step();
  return norm;
}

double settle(qwen::ClippedAdamW& optimizer, double max_norm) {
  const double norm = qwen::host_door::read(optimizer.clip_and_step(max_norm)).item<double>();
  optimizer.applied(std::isfinite(norm));
  return norm;
}

// The optimizer state's key of a parameter: its TensorImpl (LibTorch 2.x), or that address as text (1.13).
template <class State>
typename State::key_type key_of(const State&, const torch::Tensor& parameter) {
#if TORCH_VERSION_MAJOR < 2
  return c10::guts::to_string(parameter.unsafeGetTensorImpl());
#else
  return parameter.unsafeGetTensorImpl();
#endif
}

// Whether a and b agree: bit for bit where the same calls run (1.13), else within float32 rounding of their size.
bool agree(const torch::Tensor& a, const torch::Tensor& b) {
  if (!qwen::ClippedAdamW::fused()) return torch::equal(a, b);
  const double size = std::max(1.0, b.abs().max().item<double>());
  return (a - b).abs().max().item<double>() <= 1e-5 * size;
}

void check_same_state(qwen::ClippedAdamW& ours, torch::optim::AdamW& reference,
                      const std::vector<torch::Tensor>& our_parameters,
                      const std::vector<torch::Tensor>& reference_parameters) {
  REQUIRE(ours.state().size() == reference.state().size());
  for (std::size_t i = 0; i < our_parameters.size(); ++i) {
    CAPTURE(i);
    CHECK(agree(our_parameters[i].detach(), reference_parameters[i].detach()));
    const auto found = reference.state().find(key_of(reference.state(), reference_parameters[i]));
    if (found == reference.state().end()) continue;
    const auto& expected = static_cast<const torch::optim::AdamWParamState&>(*found->second);
    const auto mine = ours.state().find(key_of(ours.state(), our_parameters[i]));
    REQUIRE(mine != ours.state().end());
    const auto& got = static_cast<const torch::optim::AdamWParamState&>(*mine->second);
    CHECK(got.step() == expected.step());
    CHECK(agree(got.exp_avg(), expected.exp_avg()));
    CHECK(agree(got.exp_avg_sq(), expected.exp_avg_sq()));
  }
}

}  // namespace

TEST_CASE("ClippedAdamW: clip_grad_norm_ and torch::optim::AdamW's step, clipped or not, within float32 rounding") {
  const auto ours = make_parameters();
  const auto theirs = copies(ours);
  qwen::ClippedAdamW optimizer(ours, options());
  torch::optim::AdamW reference(theirs, options());
  for (int step = 0; step < 6; ++step) {
    CAPTURE(step);
    set_gradients(ours, step);
    set_gradients(theirs, step);
    const double max_norm = 1.0;
    const double expected = reference_step(reference, theirs, max_norm);
    const double got = settle(optimizer, max_norm);
    CHECK(got == doctest::Approx(expected).epsilon(1e-6));
    check_same_state(optimizer, reference, ours, theirs);
  }
}

TEST_CASE(
    "ClippedAdamW: a non-finite norm leaves weights, moments and step counts; a first such step leaves no state") {
  for (const float poison : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    CAPTURE(poison);
    const auto ours = make_parameters();
    const auto theirs = copies(ours);
    const auto before = copies(ours);
    qwen::ClippedAdamW optimizer(ours, options());
    torch::optim::AdamW reference(theirs, options());
    set_gradients(ours, 0, poison);
    CHECK_FALSE(std::isfinite(settle(optimizer, 1.0)));
    CHECK(optimizer.state().empty());
    for (std::size_t i = 0; i < ours.size(); ++i) CHECK(torch::equal(ours[i].detach(), before[i].detach()));
    // Then finite steps, a poisoned one between them: as the reference, which skips the same step.
    for (int step = 1; step < 5; ++step) {
      CAPTURE(step);
      const float this_poison = step == 3 ? poison : 0.0f;
      set_gradients(ours, step, this_poison);
      set_gradients(theirs, step, this_poison);
      const double expected = reference_step(reference, theirs, 1.0);
      const double got = settle(optimizer, 1.0);
      CHECK(std::isfinite(got) == std::isfinite(expected));
      check_same_state(optimizer, reference, ours, theirs);
    }
  }
}

TEST_CASE("ClippedAdamW::step_and_read: one read brings the norm and the values back and settles the step") {
  const auto ours = make_parameters();
  const auto theirs = copies(ours);
  qwen::ClippedAdamW optimizer(ours, options());
  torch::optim::AdamW reference(theirs, options());
  for (int step = 0; step < 5; ++step) {
    CAPTURE(step);
    const float poison = step == 2 ? std::numeric_limits<float>::quiet_NaN() : 0.0f;
    set_gradients(ours, step, poison);
    set_gradients(theirs, step, poison);
    const double expected = reference_step(reference, theirs, 1.0);
    const torch::Tensor values = torch::tensor({0.25 * step, -1.5}, torch::kFloat64);
    const int64_t reads = qwen::host_door::counts().reads;
    const torch::Tensor read = optimizer.step_and_read(1.0, values);
    CHECK(qwen::host_door::counts().reads - reads == 1);
    REQUIRE(read.sizes() == torch::IntArrayRef{3});
    CHECK(std::isfinite(read[0].item<double>()) == std::isfinite(expected));
    if (std::isfinite(expected)) CHECK(read[0].item<double>() == doctest::Approx(expected).epsilon(1e-6));
    CHECK(torch::equal(read.narrow(0, 1, 2), values));
    check_same_state(optimizer, reference, ours, theirs);  // settled: the next step is allowed, the state as AdamW's
  }
}

TEST_CASE("ClippedAdamW: its state saves as torch::optim::AdamW's and resumes the same steps") {
  const auto ours = make_parameters();
  qwen::ClippedAdamW optimizer(ours, options());
  for (int step = 0; step < 3; ++step) {
    set_gradients(ours, step);
    settle(optimizer, 1.0);
  }
  std::ostringstream saved;
  {
    torch::serialize::OutputArchive archive;
    optimizer.save(archive);
    archive.save_to(saved);
  }
  const auto load = [&](torch::optim::Optimizer& into) {
    std::istringstream in(saved.str());
    torch::serialize::InputArchive archive;
    archive.load_from(in);
    into.load(archive);
  };
  // A resumed ClippedAdamW takes the next steps bit for bit as the one that went on.
  const auto resumed_parameters = copies(ours);
  qwen::ClippedAdamW resumed(resumed_parameters, options());
  load(resumed);
  // torch::optim::AdamW reads the same file and takes the same next step, within float32 rounding.
  const auto plain_parameters = copies(ours);
  torch::optim::AdamW plain(plain_parameters, options());
  load(plain);
  for (int step = 3; step < 5; ++step) {
    set_gradients(ours, step);
    set_gradients(resumed_parameters, step);
    set_gradients(plain_parameters, step);
    settle(optimizer, 1.0);
    settle(resumed, 1.0);
    reference_step(plain, plain_parameters, 1.0);
  }
  for (std::size_t i = 0; i < ours.size(); ++i) {
    CHECK(torch::equal(ours[i].detach(), resumed_parameters[i].detach()));
    CHECK(agree(ours[i].detach(), plain_parameters[i].detach()));
  }
}

TEST_CASE("ClippedAdamW: a step left unsettled is refused, naming the call") {
  const auto parameters = make_parameters();
  qwen::ClippedAdamW optimizer(parameters, options());
  set_gradients(parameters, 0);
  optimizer.clip_and_step(1.0);
  if (qwen::ClippedAdamW::fused()) {  // 1.13 settles its step at once (its norm is read inside)
    set_gradients(parameters, 1);
    CHECK_THROWS_WITH_AS(optimizer.clip_and_step(1.0), doctest::Contains("call applied()"), std::exception);
  }
  optimizer.applied(true);
  set_gradients(parameters, 1);
  CHECK_NOTHROW(optimizer.clip_and_step(1.0));
}
