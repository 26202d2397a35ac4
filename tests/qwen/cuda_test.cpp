// The driver on CUDA, for a machine with a GPU: the fused loss kernel registered in a program that links dapo::torch
// exactly when dapo was built with CUDA (checked everywhere); the demo model's logits and greedy continuations on CUDA
// against the CPU, the engine's decode steps replayed as CUDA graphs against eager ones, a trainer step and a short
// demo run on CUDA (skipped with a message without a GPU); --device errors.
//
// Shapes: L = prompt + continuation tokens, V = vocabulary (259, the byte-level tokenizer's).
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/cuda.h>
#include <torch/torch.h>
#include <CLI/CLI.hpp>

#include <dapo/loss.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "qwen_gsm8k/cli/commands.hpp"
#include "qwen_gsm8k/common/json_lines.hpp"
#include "qwen_gsm8k/demo/demo.hpp"
#include "qwen_gsm8k/demo/demo_problems.hpp"
#include "qwen_gsm8k/engine/decode_graphs.hpp"
#include "qwen_gsm8k/engine/engine.hpp"
#include "qwen_gsm8k/engine/generate.hpp"
#include "qwen_gsm8k/model/autocast.hpp"
#include "qwen_gsm8k/model/device_check.hpp"
#include "qwen_gsm8k/model/fused_ops.hpp"
#include "qwen_gsm8k/model/fused_training.hpp"
#include "qwen_gsm8k/model/varlen_attention.hpp"
#include "qwen_gsm8k/model/weights.hpp"
#include "qwen_gsm8k/train/optimizer.hpp"
#include "qwen_gsm8k/train/rollout.hpp"
#include "qwen_gsm8k/train/trainer.hpp"
#include "support/qwen_fixtures.hpp"
#include "support/tiny_model.hpp"

#ifndef DAPO_TEST_EXPECT_CUDA_KERNEL
#error "tests/CMakeLists.txt defines DAPO_TEST_EXPECT_CUDA_KERNEL: 1 when the dapo_cuda target exists, else 0"
#endif

namespace {

qwen::Tokenizer demo_tokenizer() {
  return qwen::Tokenizer::byte_level({"<|endoftext|>", "<|im_start|>", "<|im_end|>"});
}

// The demo's model, initialised on the CPU from `seed` (as run_demo does), then moved to `device`.
qwen::Qwen2ForCausalLM seeded_demo_model(torch::Device device, uint64_t seed = 0) {
  torch::manual_seed(static_cast<int64_t>(seed));
  qwen::Qwen2ForCausalLM model(qwen::demo_model_config());
  qwen::initialize_weights(model);
  model->to(device);
  model->eval();
  return model;
}

// Logits [1, L, V] of one sequence, on the CPU.
torch::Tensor sequence_logits(qwen::Qwen2ForCausalLM& model, const std::vector<int64_t>& ids) {
  torch::NoGradGuard no_grad;
  const auto device = model->lm_head_weight().device();
  const torch::Tensor input = torch::tensor(ids, torch::kInt64).unsqueeze(0).to(device);
  const torch::Tensor mask = torch::ones_like(input);
  return model->forward(input, mask, qwen::position_ids_from_mask(mask)).cpu();
}

// The smallest gap between the two largest logits over `rows` of [L, V]: how far greedy decoding is from a tie.
double smallest_top2_gap(const torch::Tensor& logits) {
  const torch::Tensor top = std::get<0>(logits.topk(2, /*dim=*/-1));  // [L, 2]
  return (top.select(1, 0) - top.select(1, 1)).min().item<double>();
}

std::vector<int64_t> greedy_tokens(qwen::Qwen2ForCausalLM& model, const std::vector<int64_t>& prompt,
                                   int64_t new_tokens) {
  qwen::GenerationOptions options;
  options.max_new_tokens = new_tokens;
  options.sampling.temperature = 0.0;
  options.pad_id = 256;
  const torch::Tensor tokens = qwen::generate(model, {prompt}, options).tokens.cpu();
  return std::vector<int64_t>(tokens.data_ptr<int64_t>(), tokens.data_ptr<int64_t>() + tokens.numel());
}

// Three demo problems' prompts, n = 4 each, and greedy options with log-probs: 12 sequences through 6 slots, so live
// rows 6, 5, 3, ... are rounded up with padding.
std::pair<std::vector<qwen::EngineRequest>, qwen::EngineOptions> demo_requests(int64_t max_new_tokens) {
  const auto tokenizer = demo_tokenizer();
  std::vector<qwen::EngineRequest> requests;
  qwen::EngineOptions options;
  for (const auto& problem : qwen::make_demo_problems({.test_count = 3}).test) {
    requests.push_back({.prompt = qwen::prompt_ids(tokenizer, "Answer.", problem.question), .n = 4});
    options.max_prompt_tokens =
        std::max<int64_t>(options.max_prompt_tokens, static_cast<int64_t>(requests.back().prompt.size()));
  }
  options.max_new_tokens = max_new_tokens;
  options.sampling.temperature = 0.0;
  options.return_logprobs = true;
  options.max_num_seqs = 6;
  options.check_every = 4;
  return {requests, options};
}

}  // namespace

TEST_CASE("CUDA: the fused CUDA loss kernel is registered exactly when dapo was built with CUDA") {
  // This program links qwen_model -> dapo::torch as qwen_gsm8k does: if dapo_cuda exists, its registration must have
  // reached the program (not been dropped from a static library), else policy_loss would silently run the composite.
  const bool registered = dapo::detail::cuda_policy_loss_kernel() != nullptr;
  CAPTURE(DAPO_TEST_EXPECT_CUDA_KERNEL);
  CHECK(registered == (DAPO_TEST_EXPECT_CUDA_KERNEL != 0));
}

TEST_CASE("CUDA: the fused operators' kernels compute what their composites compute on the CPU") {
  // Built where dapo's CUDA loss is (a CUDA compiler and LibTorch's CUDA): checked everywhere.
  CHECK(qwen::fused::cuda_kernels_built() == (DAPO_TEST_EXPECT_CUDA_KERNEL != 0));
  if (!torch::cuda::is_available()) {
    MESSAGE("no CUDA device: the fused kernels' checks are skipped");
    return;
  }
  const torch::Device cuda(torch::kCUDA, 0);
  const torch::NoGradGuard no_grad;
  const auto on_cpu = [](const torch::Tensor& t) { return t.cpu().to(torch::kFloat32); };
  for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    CAPTURE(dtype);
    const double tolerance = dtype == torch::kFloat32 ? 1e-5 : 2e-2;  // bfloat16: a few of its steps (2^-8)
    const auto close = [&](const torch::Tensor& gpu, const torch::Tensor& cpu) {
      return torch::allclose(on_cpu(gpu), on_cpu(cpu), tolerance, tolerance);
    };
    torch::manual_seed(0);
    const auto make = [&](std::vector<int64_t> shape) { return torch::randn(shape).to(dtype); };

    const torch::Tensor x = make({5, 96}), residual = make({5, 96}), weight = make({96});
    const auto [normed, sum] = qwen::fused::add_rms_norm(x, residual, weight, 1e-6);
    const auto [normed_gpu, sum_gpu] = qwen::fused::add_rms_norm(x.to(cuda), residual.to(cuda), weight.to(cuda), 1e-6);
    CHECK(torch::equal(sum_gpu.cpu(), sum));  // one rounded add
    CHECK(close(normed_gpu, normed));
    // Mixed dtypes (a bfloat16 product onto a float32 residual) are the composite's on CUDA too.
    const auto [mixed, mixed_sum] = qwen::fused::add_rms_norm(x.to(cuda), residual.to(cuda).to(torch::kFloat32),
                                                              weight.to(cuda).to(torch::kFloat32), 1e-6);
    CHECK((mixed_sum.scalar_type() == torch::kFloat32));

    const torch::Tensor gate_up = make({5, 2 * 48});
    CHECK(close(qwen::fused::silu_and_mul(gate_up.to(cuda)), qwen::fused::silu_and_mul(gate_up)));

    const int64_t rows = 3, heads = 12, kv_heads = 2, dim = 16, slots = 4, capacity = 9;
    const torch::Tensor qkv = make({rows, 1, (heads + 2 * kv_heads) * dim});
    const torch::Tensor angles = torch::randn({rows, 1, 1, dim / 2}).repeat({1, 1, 1, 2});
    const torch::Tensor cos = angles.cos().to(dtype);
    const torch::Tensor sin = angles.sin();
    const torch::Tensor signed_sin =
        torch::cat({-sin.narrow(-1, 0, dim / 2), sin.narrow(-1, dim / 2, dim / 2)}, -1).to(dtype);
    const torch::Tensor slot = torch::tensor({3, 0, 1}, torch::kInt64), position = torch::tensor({8, 0, 4});
    const auto run = [&](torch::Device device) {
      const torch::Tensor keys = torch::zeros({slots, kv_heads, capacity, dim}, torch::TensorOptions(dtype));
      const torch::Tensor values = torch::zeros_like(keys);
      const torch::Tensor k = keys.to(device), v = values.to(device);
      const torch::Tensor query = qwen::fused::rope_and_cache(qkv.to(device), cos.to(device), signed_sin.to(device), k,
                                                              v, slot.to(device), position.to(device), heads, kv_heads);
      return std::vector<torch::Tensor>{query.cpu(), k.cpu(), v.cpu()};
    };
    const std::vector<torch::Tensor> gpu = run(cuda), cpu = run(torch::kCPU);
    CHECK(close(gpu[0], cpu[0]));         // the rotated query
    CHECK(close(gpu[1], cpu[1]));         // the rotated keys, at their slots and positions only
    CHECK(torch::equal(gpu[2], cpu[2]));  // the values, copied

    // The sampler at Qwen2.5's vocabulary and at a tiny one, greedy and drawn, at temperatures 1 and 0.7. Greedy:
    // the CPU's tokens. Drawn: each token's interval of the exact (float64) CDF holds u x total within float32's
    // rounding of a 151,936-term sum (the kernel sums in another order than the CPU, so a uniform that close to a
    // bound may fall on either side), and has positive probability. The log-probs: the CPU's, within that rounding.
    for (const int64_t vocab : {int64_t{151936}, int64_t{7}}) {
      CAPTURE(vocab);
      const int64_t draws = 8;
      torch::Tensor logits = (torch::randn({draws, vocab}) * 4).to(dtype);
      logits[1].narrow(0, vocab - 3, 3).fill_(-std::numeric_limits<float>::infinity());  // probability 0
      torch::Tensor uniforms = torch::rand({draws});
      uniforms[0] = 0.0F;
      uniforms[1] = 1.0F - 0x1.0p-23F;  // the largest: the last token of positive probability
      for (const double temperature : {1.0, 0.7}) {
        CAPTURE(temperature);
        const torch::Tensor exact = (logits.to(torch::kFloat64) / temperature).log_softmax(-1);
        const torch::Tensor cdf = exact.exp().cumsum(-1);
        for (const bool greedy : {true, false}) {
          CAPTURE(greedy);
          const torch::Tensor u = greedy ? torch::Tensor() : uniforms;
          const auto [token, logprob] = qwen::fused::sample_tokens(logits, u, temperature);
          const auto [token_gpu, logprob_gpu] =
              qwen::fused::sample_tokens(logits.to(cuda), greedy ? u : u.to(cuda), temperature);
          CHECK(torch::allclose(logprob_gpu.cpu(), logprob, 1e-4, 1e-4));
          if (greedy) {
            CHECK(torch::equal(token_gpu.cpu(), token));
            continue;
          }
          for (int64_t r = 0; r < draws; ++r) {
            CAPTURE(r);
            const int64_t t = token_gpu[r].item<int64_t>();
            REQUIRE((t >= 0 && t < vocab));
            const double below = t > 0 ? cdf[r][t - 1].item<double>() : 0.0, upto = cdf[r][t].item<double>();
            const double target = uniforms[r].item<double>() * cdf[r][vocab - 1].item<double>();
            CHECK(exact[r][t].item<double>() > -std::numeric_limits<double>::infinity());
            CHECK(below - 1e-4 <= target);
            CHECK(target <= upto + 1e-4);
          }
        }
      }
    }
  }
}

TEST_CASE("CUDA: the training forward's fused operators' kernels compute their composites, forward and backward") {
  if (!torch::cuda::is_available()) {
    MESSAGE("no CUDA device: the training kernels' checks are skipped");
    return;
  }
  const torch::Device cuda(torch::kCUDA, 0);
  const torch::NoGradGuard no_grad;
  const auto op = [](const char* name) { return c10::Dispatcher::singleton().findSchemaOrThrow(name, ""); };
  // Each operator boxed on CUDA inputs and on the CPU (the composite), outputs compared as float32.
  const auto compare = [&](const char* name, const std::vector<c10::IValue>& inputs, double tolerance) {
    CAPTURE(name);
    const auto run = [&](torch::Device device) {
      torch::jit::Stack stack;
      for (const c10::IValue& input : inputs) {
        stack.push_back(input.isTensor() && input.toTensor().defined() ? c10::IValue(input.toTensor().to(device))
                                                                       : input);
      }
      op(name).callBoxed(&stack);
      std::vector<torch::Tensor> out;
      for (const c10::IValue& value : stack) out.push_back(value.toTensor().cpu().to(torch::kFloat32));
      return out;
    };
    const std::vector<torch::Tensor> gpu = run(cuda), cpu = run(torch::kCPU);
    REQUIRE(gpu.size() == cpu.size());
    for (std::size_t i = 0; i < gpu.size(); ++i) {
      CAPTURE(i);
      CHECK(gpu[i].sizes() == cpu[i].sizes());
      CHECK(torch::allclose(gpu[i], cpu[i], tolerance, tolerance));
    }
  };
  torch::manual_seed(0);
  const c10::IValue none;
  for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    CAPTURE(dtype);
    const double tolerance = dtype == torch::kFloat32 ? 1e-5 : 2e-2;
    const auto make = [&](std::vector<int64_t> shape) { return torch::randn(shape).to(dtype); };
    // The norms: one dtype, and autocast's (a 16-bit x onto a float32 residual and weight, the output in x's dtype).
    const torch::Tensor x = make({2, 5, 96}), residual = make({2, 5, 96}), weight = make({96});
    const torch::Tensor residual32 = residual.to(torch::kFloat32), weight32 = weight.to(torch::kFloat32);
    compare("qwen::rms_norm_forward", {residual, weight, 1e-6, dtype}, tolerance);
    compare("qwen::add_rms_norm_forward", {x, residual, weight, 1e-6, dtype}, tolerance);
    compare("qwen::add_rms_norm_forward", {x, residual32, weight32, 1e-6, dtype}, tolerance);
    const torch::Tensor sum = residual32 + x, inverse = torch::rsqrt(sum.pow(2).mean(-1, true) + 1e-6);
    for (const bool with_sum : {false, true}) {
      compare("qwen::rms_norm_backward",
              {make({2, 5, 96}), with_sum ? c10::IValue(torch::randn({2, 5, 96})) : none, sum, weight32, inverse, true,
               true},
              tolerance);
    }
    const torch::Tensor gate_up = make({2, 5, 2 * 48});
    compare("qwen::silu_and_mul_backward", {make({2, 5, 48}), gate_up}, tolerance);
    // RoPE: batched heads first, and packed tokens.
    const int64_t heads = 12, kv_heads = 2, dim = 16, batch = 2, positions = 7, width = heads + 2 * kv_heads;
    const torch::Tensor product = make({batch, positions, width * dim});
    const torch::Tensor cos = torch::rand({batch, 1, positions, dim}).to(dtype);
    const torch::Tensor sin = torch::rand({batch, 1, positions, dim}).to(dtype);
    compare("qwen::rotary_qkv_heads", {product, cos, sin, heads, kv_heads}, tolerance);
    compare("qwen::rotary_qkv", {product, cos, sin, heads, kv_heads}, tolerance);
    const std::vector<int64_t> shape{batch, positions, width * dim};
    compare("qwen::rotary_qkv_backward", {make({batch, positions, width, dim}), cos, sin, heads, kv_heads, shape},
            tolerance);
    const torch::Tensor gq = make({batch, heads, positions, dim}), gk = make({batch, kv_heads, positions, dim});
    compare("qwen::rotary_qkv_heads_backward",
            {gq, gk, make({batch, kv_heads, positions, dim}), cos, sin, heads, kv_heads, shape}, tolerance);
    compare("qwen::rotary_qkv_heads_backward", {gq, none, gk, cos, sin, heads, kv_heads, shape}, tolerance);
  }
}

TEST_CASE("CUDA: the training forward through the fused kernels gives the unfused calls' logits and gradients") {
  if (!torch::cuda::is_available()) {
    MESSAGE("no CUDA device: the fused training forward's check is skipped");
    return;
  }
  torch::manual_seed(5);
  qwen::Qwen2ForCausalLM model(dapo::test::tiny_qwen_config(97, 64, 4, 2, 2));
  model->to(torch::Device(torch::kCUDA, 0));
  const auto options = torch::TensorOptions().device(torch::kCUDA, 0).dtype(torch::kInt64);
  const torch::Tensor ids = torch::randint(0, 97, {2, 12}, options);
  const torch::Tensor mask = torch::ones({2, 12}, options);
  const torch::Tensor positions = qwen::position_ids_from_mask(mask);
  for (const std::optional<torch::ScalarType> autocast :
       {std::optional<torch::ScalarType>{}, std::optional{torch::kBFloat16}}) {
    CAPTURE(autocast.has_value());
    const auto pass = [&](bool fused) {
      std::optional<qwen::fused::UnfusedTraining> unfused;
      if (!fused) unfused.emplace();
      model->zero_grad();
      torch::Tensor logits;
      {
        const qwen::AutocastGuard guard(torch::kCUDA, autocast);
        logits = model->forward(ids, mask, positions).to(torch::kFloat32);
      }
      torch::manual_seed(9);
      (logits * torch::randn(logits.sizes(), logits.options())).sum().backward();
      std::vector<torch::Tensor> out{logits.detach().cpu()};
      for (const auto& parameter : model->parameters()) out.push_back(parameter.grad().cpu());
      return out;
    };
    const std::vector<torch::Tensor> fused = pass(true), plain = pass(false);
    const double tolerance = autocast ? 3e-2 : 1e-4;
    REQUIRE(fused.size() == plain.size());
    for (std::size_t i = 0; i < fused.size(); ++i) {
      CAPTURE(i);
      const double scale = std::max(1.0, plain[i].abs().max().item<double>());
      CHECK((fused[i] - plain[i]).abs().max().item<double>() <= tolerance * scale);
    }
  }
}

TEST_CASE("CUDA: the shared-prompt forward through FlashAttention's variable-length call gives the masked path's") {
  if (!torch::cuda::is_available()) {
    MESSAGE("no CUDA device: the variable-length attention check is skipped");
    return;
  }
  const torch::Device cuda(torch::kCUDA, 0);
  // The kernel runs here at this model's heads and at Qwen2.5-1.5B's (12 query heads, 2 key/value heads of 128).
  REQUIRE(qwen::varlen_attention_usable(cuda, torch::kBFloat16, 4, 2, 16));
  CHECK(qwen::varlen_attention_usable(cuda, torch::kBFloat16, 12, 2, 128));
  torch::manual_seed(5);
  qwen::Qwen2ForCausalLM model(dapo::test::tiny_qwen_config(97, 64, 4, 2, 2));
  model->to(cuda);
  // Prompts of 5, 8 and 3 tokens; six responses of 1, 4, 0, 7, 3 and 6 tokens, two per prompt.
  const torch::Tensor prompt_lengths = torch::tensor({5, 8, 3}, torch::kInt64);
  const torch::Tensor response_lengths = torch::tensor({1, 4, 0, 7, 3, 6}, torch::kInt64);
  qwen::SharedPromptBatch batch{torch::randint(1, 97, {3, 8}, torch::kInt64), prompt_lengths,
                                torch::randint(1, 97, {6, 7}, torch::kInt64), response_lengths,
                                torch::tensor({0, 0, 1, 1, 2, 2}, torch::kInt64)};
  for (const bool checkpointing : {false, true}) {
    CAPTURE(checkpointing);
    model->model->set_gradient_checkpointing(checkpointing);
    const auto pass = [&](qwen::SharedAttention attention) {
      const qwen::SharedAttentionChoice choice(attention);
      model->zero_grad();
      torch::Tensor hidden;
      {
        const qwen::AutocastGuard guard(cuda, torch::kBFloat16);
        hidden = model->model->forward_shared(batch).to(torch::kFloat32);
      }
      (hidden * torch::sin(torch::arange(hidden.numel(), hidden.options()).view(hidden.sizes()))).sum().backward();
      std::vector<torch::Tensor> out{hidden.detach().cpu()};
      for (const auto& parameter : model->parameters()) out.push_back(parameter.grad().cpu());
      return out;
    };
    const std::vector<torch::Tensor> packed = pass(qwen::SharedAttention::kAuto);
    const std::vector<torch::Tensor> masked = pass(qwen::SharedAttention::kMasked);
    REQUIRE(packed.size() == masked.size());
    CHECK(packed[0].size(0) == 16 + 21);  // the real tokens only
    for (std::size_t i = 0; i < packed.size(); ++i) {
      CAPTURE(i);
      const double scale = std::max(1.0, masked[i].abs().max().item<double>());
      const double difference = (packed[i] - masked[i]).abs().max().item<double>();
      MESSAGE("tensor " << i << ": max |packed - masked| " << difference << " of " << scale);
      CHECK(difference <= 3e-2 * scale);
    }
  }
}

TEST_CASE("CUDA: --device is checked with the option named, on the command line and in run_demo") {
  const auto parse = [](std::vector<std::string> args) {
    CLI::App app;
    qwen::cli::DemoCommand command;
    qwen::cli::add_demo_command(app, command);
    std::reverse(args.begin(), args.end());  // CLI11 takes them last first
    app.parse(args);
    return command.options.device;
  };
  CHECK(parse({"demo"}) == torch::Device(torch::kCPU));
  CHECK(parse({"demo", "--device", "cpu"}) == torch::Device(torch::kCPU));
  CHECK_THROWS_WITH_AS(parse({"demo", "--device", "gpu"}),
                       doctest::Contains("--device: \"gpu\" is not a device, expected cpu or cuda[:N]"),
                       CLI::ValidationError);
  CHECK_THROWS_WITH_AS(qwen::check_demo_device(torch::Device("meta")),
                       doctest::Contains("--device meta is not supported, expected cpu or cuda[:N]"),
                       std::invalid_argument);
  if (!torch::cuda::is_available()) {
    // The sentence says which is missing: CUDA in this LibTorch (Debian's), or a GPU (pip's torch on a CPU machine).
    const std::string missing = qwen::libtorch_has_cuda() ? "this LibTorch has CUDA, but no GPU is visible"
                                                          : "this program's LibTorch was built without CUDA";
    CHECK_THROWS_WITH_AS(parse({"demo", "--device", "cuda"}),
                         doctest::Contains(("demo: --device cuda asks for CUDA" +
                                            std::string(qwen::libtorch_has_cuda() ? "; " : ", but ") + missing)
                                               .c_str()),
                         CLI::ValidationError);
    for (const char* command : {"train", "eval", "generate"}) {
      CAPTURE(command);
      CHECK_THROWS_WITH_AS(qwen::usable_device("cuda", command),
                           doctest::Contains((std::string(command) + ": --device cuda asks for CUDA").c_str()),
                           std::invalid_argument);
    }
    CHECK_THROWS_WITH_AS(qwen::usable_device("gpu", "train"),
                         doctest::Contains("train: --device \"gpu\" is not a device, expected cpu or cuda[:N]"),
                         std::invalid_argument);
    dapo::test::ScratchDir scratch;
    qwen::DemoOptions demo;
    demo.output_dir = scratch.path();  // refused before anything is written; nothing would land in the working dir
    demo.quiet = true;
    demo.device = torch::Device(torch::kCUDA);
    CHECK_THROWS_WITH_AS(qwen::run_demo(demo), doctest::Contains("--device cuda asks for CUDA"), std::invalid_argument);
    return;
  }
  CHECK(parse({"demo", "--device", "cuda:0"}) == torch::Device(torch::kCUDA, 0));
  const auto count = static_cast<int>(torch::cuda::device_count());
  const std::string past_the_last = "names GPU " + std::to_string(count);
  CHECK_THROWS_WITH_AS(qwen::check_demo_device(torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(count))),
                       doctest::Contains(past_the_last.c_str()), std::invalid_argument);
}

TEST_CASE("CUDA: the demo model gives the CPU's logits and greedy continuations on CUDA") {
  if (!torch::cuda::is_available()) {
    MESSAGE("no CUDA device: the model-on-CUDA checks are skipped");
    return;
  }
  auto cpu = seeded_demo_model(torch::kCPU);
  auto cuda = seeded_demo_model(torch::Device(torch::kCUDA, 0));
  CHECK(cuda->lm_head_weight().is_cuda());
  for (const auto& item : cuda->named_parameters()) {
    CAPTURE(item.key());
    CHECK(torch::equal(item.value().cpu(), cpu->named_parameters()[item.key()]));  // the same seeded start
  }
  const auto tokenizer = demo_tokenizer();
  const auto problems = qwen::make_demo_problems({.test_count = 3});
  constexpr int64_t kNewTokens = 16;
  for (const auto& problem : problems.test) {
    CAPTURE(problem.question);
    const std::vector<int64_t> prompt = qwen::prompt_ids(tokenizer, "Answer.", problem.question);
    const std::vector<int64_t> on_cpu = greedy_tokens(cpu, prompt, kNewTokens);
    const std::vector<int64_t> on_cuda = greedy_tokens(cuda, prompt, kNewTokens);
    // Teacher-forced along the CPU's continuation: every position's logits, float32 on both devices.
    std::vector<int64_t> sequence = prompt;
    sequence.insert(sequence.end(), on_cpu.begin(), on_cpu.end());
    const torch::Tensor cpu_logits = sequence_logits(cpu, sequence)[0];  // [L, V]
    const torch::Tensor cuda_logits = sequence_logits(cuda, sequence)[0];
    const double difference = (cuda_logits - cpu_logits).abs().max().item<double>();
    CAPTURE(difference);
    CHECK(torch::allclose(cuda_logits, cpu_logits, /*rtol=*/1e-4, /*atol=*/1e-4));
    // The greedy choices: the same tokens, unless the CPU itself was within the logits' tolerance of a tie.
    const auto steps = static_cast<int64_t>(prompt.size()) - 1;
    const double gap = smallest_top2_gap(cpu_logits.narrow(0, steps, kNewTokens));
    CAPTURE(gap);
    if (gap > 1e-3) {
      CHECK(on_cuda == on_cpu);
    } else {
      MESSAGE("a near tie (top-2 logit gap " << gap << "): the continuations are not compared for this prompt");
    }
  }
}

TEST_CASE("CUDA: decode steps replayed as CUDA graphs give the eager steps' sequences") {
  if (!torch::cuda::is_available()) {
    MESSAGE("no CUDA device: the CUDA-graph decode check is skipped");
    return;
  }
  CHECK(qwen::DecodeGraphs::compiled());  // a program that reaches a GPU was built against CUDA LibTorch
  auto model = seeded_demo_model(torch::Device(torch::kCUDA, 0));
  auto [requests, options] = demo_requests(24);
  for (std::size_t r = 0; r < requests.size(); ++r) requests[r].max_tokens = 4 + static_cast<int64_t>(r * 7) % 21;
  for (const bool bfloat16 : {false, true}) {
    CAPTURE(bfloat16);
    const qwen::AutocastGuard autocast(torch::Device(torch::kCUDA, 0),
                                       bfloat16 ? std::optional(torch::kBFloat16) : std::nullopt);
    options.cuda_graphs = false;
    options.graph_shapes = true;  // the eager steps at the shapes the graphs replay
    qwen::EngineStats eager_stats, graph_stats;
    const auto eager = qwen::generate_requests(model, requests, options, &eager_stats);
    options.cuda_graphs = true;
    options.graph_shapes = false;
    const auto graphs = qwen::generate_requests(model, requests, options, &graph_stats);
    CHECK(eager_stats.graph_replays == 0);
    CHECK(graph_stats.graph_captures > 0);
    CHECK(graph_stats.graph_replays > 0);
    // Each shape ran eagerly once before its capture; every other step was a replay.
    CHECK(graph_stats.decode_calls - graph_stats.graph_replays >= graph_stats.graph_captures);
    CHECK(graph_stats.rows_computed == eager_stats.rows_computed);
    for (std::size_t r = 0; r < requests.size(); ++r) {
      for (std::size_t i = 0; i < 4; ++i) {
        CHECK(graphs[r][i].tokens == eager[r][i].tokens);
        CHECK(torch::allclose(torch::tensor(graphs[r][i].logprobs), torch::tensor(eager[r][i].logprobs), 1e-4, 1e-4));
      }
    }
  }
}

TEST_CASE("CUDA: a kept engine's graphs replay the weights as the optimizer leaves them (bfloat16 autocast)") {
  if (!torch::cuda::is_available()) {
    MESSAGE("no CUDA device: the kept engine's graph check is skipped");
    return;
  }
  auto model = seeded_demo_model(torch::Device(torch::kCUDA, 0));
  const auto [requests, options] = demo_requests(16);
  const qwen::AutocastGuard autocast(torch::Device(torch::kCUDA, 0), torch::kBFloat16);
  qwen::GenerationEngine kept(model, options);
  qwen::EngineStats first, second, fresh_stats;
  qwen::generate_requests(kept, requests, &first);
  {
    torch::NoGradGuard no_grad;  // an optimizer step: every weight changed in place
    for (auto& parameter : model->parameters()) parameter.mul_(0.75);
  }
  const auto replayed = qwen::generate_requests(kept, requests, &second);
  qwen::GenerationEngine fresh(model, options);
  const auto captured = qwen::generate_requests(fresh, requests, &fresh_stats);
  CHECK(first.graph_captures > 0);
  CHECK(second.graph_captures == 0);  // the first run's graphs, replayed
  CHECK(second.graph_replays == second.decode_calls);
  CHECK(fresh_stats.graph_captures > 0);
  for (std::size_t r = 0; r < requests.size(); ++r) {
    for (std::size_t i = 0; i < 4; ++i) {
      CHECK(replayed[r][i].tokens == captured[r][i].tokens);  // the new weights, read through the refreshed casts
      // The fresh engine ran each shape eagerly once before capturing it (as the eager-versus-graph test compares).
      CHECK(
          torch::allclose(torch::tensor(replayed[r][i].logprobs), torch::tensor(captured[r][i].logprobs), 1e-4, 1e-4));
    }
  }
}

TEST_CASE("CUDA: ClippedAdamW's fused kernels step as the CPU does, and skip a non-finite norm") {
  if (!torch::cuda::is_available()) {
    MESSAGE("no CUDA device: the fused optimizer's check is skipped");
    return;
  }
  const auto options = torch::optim::AdamWOptions(1e-2).betas({0.9, 0.99}).weight_decay(0.1);
  torch::manual_seed(4);
  const std::vector<int64_t> sizes{151936 * 3, 1536, 1};  // a large parameter, a norm's, a scalar
  std::vector<torch::Tensor> cpu, gpu;
  for (const int64_t size : sizes) {
    cpu.push_back(torch::randn({size}).requires_grad_());
    gpu.push_back(cpu.back().detach().to(torch::kCUDA).requires_grad_());
  }
  qwen::ClippedAdamW on_cpu(cpu, options), on_gpu(gpu, options);
  for (int step = 0; step < 4; ++step) {
    CAPTURE(step);
    const bool poisoned = step == 2;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      cpu[i].mutable_grad() = torch::randn({sizes[i]}) * (step % 2 == 0 ? 0.01 : 1.0);
      if (poisoned && i == 1) cpu[i].mutable_grad()[5].fill_(std::numeric_limits<float>::quiet_NaN());
      gpu[i].mutable_grad() = cpu[i].grad().to(torch::kCUDA);
    }
    const double cpu_norm = on_cpu.clip_and_step(1.0).item<double>();
    const double gpu_norm = on_gpu.clip_and_step(1.0).item<double>();
    on_cpu.applied(std::isfinite(cpu_norm));
    on_gpu.applied(std::isfinite(gpu_norm));
    CHECK(std::isfinite(gpu_norm) == !poisoned);
    if (!poisoned) CHECK(gpu_norm == doctest::Approx(cpu_norm).epsilon(1e-5));
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      const double size = std::max(1.0, cpu[i].detach().abs().max().item<double>());
      CHECK((gpu[i].detach().cpu() - cpu[i].detach()).abs().max().item<double>() <= 1e-5 * size);
    }
  }
}

TEST_CASE("CUDA: one trainer step on CUDA runs, keeps the weights there and gives a finite loss") {
  if (!torch::cuda::is_available()) {
    MESSAGE("no CUDA device: the trainer-on-CUDA check is skipped");
    return;
  }
  auto model = seeded_demo_model(torch::Device(torch::kCUDA, 0));
  const auto problems = qwen::make_demo_problems({.test_count = 4});
  qwen::TrainOptions options = dapo::test::small_train_options({});
  options.total_steps = 1;
  options.system_prompt = "Answer.";
  qwen::Trainer trainer(model, demo_tokenizer(), problems.train, problems.test, options);
  const torch::Tensor before = model->parameters()[0].detach().clone();
  const nlohmann::json row = trainer.step();
  CAPTURE(row.dump());
  CHECK(std::isfinite(row.at("actor/pg_loss").get<double>()));
  CHECK(std::isfinite(row.at("actor/entropy").get<double>()));
  CHECK(std::isfinite(row.at("actor/grad_norm").get<double>()));
  CHECK(row.at("actor/skipped_updates") == 0);
  for (const auto& parameter : model->parameters()) CHECK(parameter.is_cuda());
  CHECK_FALSE(model->parameters()[0].detach().equal(before));  // it trained
  CHECK(trainer.evaluate().problems == 2);                     // greedy evaluation on CUDA
}

TEST_CASE("CUDA: a short demo run on CUDA: warm start, GRPO step, evaluations, summary and a loadable checkpoint") {
  if (!torch::cuda::is_available()) {
    MESSAGE("no CUDA device: the demo-on-CUDA check is skipped");
    return;
  }
  dapo::test::ScratchDir scratch;
  qwen::DemoOptions demo;
  demo.output_dir = scratch.path();
  demo.device = torch::Device(torch::kCUDA);
  demo.algorithm = qwen::Algorithm::kGrpo;  // no dynamic sampling: a barely warm model may agree in every group
  demo.sft_steps = 10;
  demo.sft_min_steps = 10;
  demo.sft_check_every = 10;
  demo.sft_check_problems = 4;
  demo.sft_batch = 8;
  demo.rl_steps = 1;
  demo.rl_groups = 2;
  demo.rl_mini_groups = 1;
  demo.rollout_n = 2;
  demo.ppo_epochs = 1;
  demo.eval_problems = 4;
  demo.quiet = true;
  const nlohmann::json summary = qwen::run_demo(demo);
  CHECK(summary.at("device") == "cuda:0");
  CHECK(summary.at("warm_start_steps") == 10);
  CHECK(summary.at("evals").size() == 2);  // after the warm start and after the step
  CHECK(qwen::read_json_lines(scratch.path() / "metrics.jsonl").size() == 1);
  CHECK(dapo::test::read_json(scratch.path() / "summary.json").at("device") == "cuda:0");
  // The checkpoint was written from CUDA weights and loads on the CPU.
  const auto checkpoint = scratch.path() / "checkpoints" / "step-000001";
  REQUIRE(std::filesystem::exists(checkpoint / "model.safetensors"));
  auto loaded = qwen::load_model(checkpoint);
  for (const auto& parameter : loaded->parameters()) CHECK(torch::isfinite(parameter).all().item<bool>());
}
