// The Qwen2 model against the tiny golden checkpoints: logits and target log-probs (1e-4), NLL gradients (1e-4
// relative), greedy continuations with and without the KV cache, batched (left-padded) and one by one.
#include <torch/torch.h>

#include <cmath>
#include <sstream>

#include "qwen_gsm8k/engine/generate.hpp"
#include "qwen_gsm8k/model/weights.hpp"
#include "support/qwen_fixtures.hpp"
#include "support/tensors.hpp"
#include "support/tiny_model.hpp"

namespace {

struct Golden {
  torch::Tensor input_ids, attention_mask, position_ids, logits, target_logprobs;
  double nll = 0;
  nlohmann::json grads, grad_shapes, greedy;
};

Golden read_golden(const std::filesystem::path& dir) {
  const auto json = dapo::test::read_json(dir / "expected.json");
  auto tensor = [](const nlohmann::json& value, torch::ScalarType dtype) {
    const auto flat = dapo::test::flatten(value);
    std::vector<int64_t> shape;
    for (const nlohmann::json* level = &value; level->is_array(); level = &(*level)[0]) {
      shape.push_back(static_cast<int64_t>(level->size()));
    }
    return torch::tensor(flat, torch::kFloat64).reshape(shape).to(dtype);
  };
  Golden g;
  g.input_ids = tensor(json.at("input_ids"), torch::kInt64);
  g.attention_mask = tensor(json.at("attention_mask"), torch::kInt64);
  g.position_ids = tensor(json.at("position_ids"), torch::kInt64);
  g.logits = tensor(json.at("logits"), torch::kFloat64);
  g.target_logprobs = tensor(json.at("target_logprobs"), torch::kFloat64);
  g.nll = json.at("nll");
  g.grads = json.at("grads");
  g.grad_shapes = json.at("grad_shapes");
  g.greedy = json.at("greedy");
  return g;
}

double relative_error(const torch::Tensor& actual, const torch::Tensor& expected) {
  return (actual.to(torch::kFloat64).cpu() - expected).norm().item<double>() / expected.norm().item<double>();
}

// How far the model is from a golden file: the largest |difference| of logits and target log-probs over real tokens,
// the NLL's and the largest gradient's relative error, and greedy tokens that differ where the reference's top-1/top-2
// margin was clear (>= 1e-4; a near-tie may go either way in another float order).
struct GoldenErrors {
  double logits = 0, target_logprobs = 0, nll = 0, gradients = 0;
  int64_t greedy_mismatches = 0, greedy_compared = 0;
};

// Loads dir's model onto `device` (float32) and compares its logits, log-probs, NLL gradient and greedy continuations
// (batched and left-padded, with and without the KV cache) with dir/expected.json.
GoldenErrors compare_with_golden(const std::filesystem::path& dir, torch::Device device) {
  const Golden golden = read_golden(dir);
  auto model = qwen::load_model(dir, torch::kFloat32, device);
  GoldenErrors errors;

  // Position ids from the mask, as generation makes them.
  CHECK(torch::equal(qwen::position_ids_from_mask(golden.attention_mask), golden.position_ids));
  const torch::Tensor ids = golden.input_ids.to(device), mask = golden.attention_mask.to(device);
  const torch::Tensor positions = golden.position_ids.to(device);
  const torch::Tensor logits = model->forward(ids, mask, positions);
  const torch::Tensor real = golden.attention_mask.to(torch::kBool);
  errors.logits =
      (logits.to(torch::kFloat64).cpu() - golden.logits).abs().masked_select(real.unsqueeze(-1)).max().item<double>();
  // The last position alone, as generation asks for it: the full forward's hidden states at that position (bit for
  // bit: the same computation) times the lm-head, a product of B rows where the full forward's has B x T. BLAS may sum
  // each dot product in another order for another shape (OpenBLAS's Haswell kernels do here, and cuBLAS may pick
  // another algorithm), so the two are compared within float32's bound for a dot product of length H in any order:
  // |fl(h.w) - h.w| <= gamma_H |h|.|w|, gamma_H = H u / (1 - H u), u = 2^-24; two such results differ by at most twice
  // that.
  const torch::Tensor last = model->last_logits(ids, mask, positions);
  {
    const torch::NoGradGuard no_grad;
    const torch::Tensor hidden = model->hidden_states(ids, mask, positions).select(1, -1);
    const torch::Tensor weight = model->lm_head_weight();
    CHECK(torch::equal(last, torch::matmul(hidden, weight.t())));
    const auto size = static_cast<double>(hidden.size(-1));
    const double u = std::ldexp(1.0, -24), gamma = size * u / (1 - size * u);
    const torch::Tensor bound =
        2 * gamma * torch::matmul(hidden.abs().to(torch::kFloat64), weight.abs().to(torch::kFloat64).t());
    const torch::Tensor difference = (last.to(torch::kFloat64) - logits.select(1, -1).to(torch::kFloat64)).abs();
    CHECK((difference <= bound).all().item<bool>());
  }

  // log-softmax at t, taken at token t + 1; the NLL averages pairs where both positions are real tokens.
  const torch::Tensor log_probs = logits.log_softmax(-1);
  const int64_t steps = logits.size(1) - 1;
  const torch::Tensor targets = ids.narrow(1, 1, steps);
  const torch::Tensor target_logprobs = log_probs.narrow(1, 0, steps).gather(-1, targets.unsqueeze(-1)).squeeze(-1);
  const torch::Tensor pairs = (real.narrow(1, 0, steps) & real.narrow(1, 1, steps)).to(device);
  errors.target_logprobs = (target_logprobs.to(torch::kFloat64).cpu() - golden.target_logprobs)
                               .abs()
                               .masked_select(pairs.cpu())
                               .max()
                               .item<double>();
  const torch::Tensor nll = -(target_logprobs.masked_select(pairs)).mean();
  errors.nll = std::abs(nll.item<double>() - golden.nll) / std::abs(golden.nll);

  nll.backward();
  std::map<std::string, torch::Tensor> parameters;
  for (const auto& item : model->named_parameters()) parameters[item.key()] = item.value();
  for (const auto& [parameter_name, values] : golden.grads.items()) {
    CAPTURE(parameter_name);
    REQUIRE(parameters.count(parameter_name));
    const torch::Tensor expected = torch::tensor(dapo::test::flatten(values), torch::kFloat64)
                                       .reshape(golden.grad_shapes.at(parameter_name).get<std::vector<int64_t>>());
    errors.gradients = std::max(errors.gradients, relative_error(parameters[parameter_name].grad(), expected));
  }

  // Greedy continuations: batched and left-padded, one by one, with and without the cache.
  const auto prompts = golden.greedy.at("prompts").get<std::vector<std::vector<int64_t>>>();
  const auto expected = golden.greedy.at("continuations").get<std::vector<std::vector<int64_t>>>();
  // Optional: the reference's top-1 minus top-2 logit at each step (the device check's files have them).
  std::vector<std::vector<double>> margins;
  if (golden.greedy.contains("margins")) margins = golden.greedy.at("margins").get<std::vector<std::vector<double>>>();
  constexpr double near_tie = 1e-4;  // a top-1/top-2 logit margin under this may go either way in another float order
  qwen::GenerationOptions options;
  options.max_new_tokens = golden.greedy.at("new_tokens");
  options.sampling.temperature = 0.0;
  // The engine (generate()) and the reference decoder (no cache).
  const auto decode = [&](const std::vector<std::vector<int64_t>>& batch, bool use_cache) {
    return use_cache ? qwen::generate(model, batch, options) : qwen::reference_generate(model, batch, options);
  };
  for (const bool use_cache : {true, false}) {
    CAPTURE(use_cache);
    const auto batched = decode(prompts, use_cache);
    const torch::Tensor tokens = batched.tokens.cpu();
    for (std::size_t b = 0; b < prompts.size(); ++b) {
      const auto row = tokens[static_cast<int64_t>(b)];
      const std::vector<int64_t> ours(row.data_ptr<int64_t>(), row.data_ptr<int64_t>() + row.numel());
      // Compared up to the first near-tie of the reference: after a different token the rest may differ too.
      for (std::size_t t = 0; t < ours.size() && t < expected[b].size(); ++t) {
        if (!margins.empty() && margins[b][t] < near_tie) break;
        ++errors.greedy_compared;
        if (ours[t] != expected[b][t]) {
          ++errors.greedy_mismatches;
          break;
        }
      }
      // One prompt alone: its products have other shapes than the batch's, which BLAS may sum in another order, so
      // the two continuations are the same up to the first step whose top two logits are a near-tie (checked on the
      // batch's own prefix, without the cache); from there on, either continuation is right.
      const auto alone = decode({prompts[b]}, use_cache);
      const torch::Tensor alone_row = alone.tokens[0].cpu();
      if (!torch::equal(alone_row, row)) {
        const int64_t first = (alone_row != row).nonzero()[0][0].item<int64_t>();
        std::vector<int64_t> prefix = prompts[b];
        prefix.insert(prefix.end(), ours.begin(), ours.begin() + first);
        const torch::Tensor prefix_ids = torch::tensor(prefix, torch::kInt64).unsqueeze(0).to(device);
        const torch::Tensor ones = torch::ones_like(prefix_ids);
        const torch::NoGradGuard no_grad;
        const torch::Tensor top =
            std::get<0>(model->last_logits(prefix_ids, ones, qwen::position_ids_from_mask(ones)).squeeze(0).topk(2));
        const double margin = (top[0] - top[1]).item<double>();
        CAPTURE(first);
        CAPTURE(margin);
        CHECK(margin < near_tie);
      }
    }
    CHECK(batched.truncated.all().item<bool>());
  }
  return errors;
}

// The tolerances of shared/README.md, which a correct float32 implementation meets.
void check_within_float32_tolerances(const GoldenErrors& errors) {
  CHECK(errors.logits < 1e-4);
  CHECK(errors.target_logprobs < 1e-4);
  CHECK(errors.nll < 1e-5);
  CHECK(errors.gradients < 1e-4);
  CHECK(errors.greedy_mismatches == 0);
  CHECK(errors.greedy_compared > 0);
}

std::string describe(const GoldenErrors& errors) {
  std::ostringstream out;
  out << "logits max |diff| " << errors.logits << ", target log-probs " << errors.target_logprobs << ", NLL rel "
      << errors.nll << ", gradients rel " << errors.gradients << ", greedy " << errors.greedy_mismatches
      << " mismatches in " << errors.greedy_compared << " compared tokens";
  return out.str();
}

// Golden files made by Hugging Face transformers itself: the committed tiny model (tests/fixtures/transformers/, made
// by tests/fixtures/transformers_golden.py in the Debian sid root: scripts/libtorch2.sh sid python), and any further
// directories named in DAPO_TRANSFORMERS_GOLDENS (colon-separated; each holds config.json, the weights and
// expected.json: the transformers leg's models, made afresh and in several configurations by
// scripts/transformers-check.sh; the device check's own fixture and a checkpoint our trainer saved, with transformers'
// outputs on it).
std::vector<std::filesystem::path> transformers_goldens() {
  std::vector<std::filesystem::path> dirs;
  const std::filesystem::path committed =
      std::filesystem::path(DAPO_SOURCE_DIR) / "tests" / "fixtures" / "transformers";
  if (std::filesystem::exists(committed / "expected.json")) dirs.push_back(committed);
  if (const char* extra = std::getenv("DAPO_TRANSFORMERS_GOLDENS")) {
    std::stringstream list(extra);
    for (std::string dir; std::getline(list, dir, ':');) {
      if (!dir.empty()) dirs.emplace_back(dir);
    }
  }
  return dirs;
}

}  // namespace

TEST_CASE("the three tiny checkpoints load and reproduce logits, log-probs, NLL gradients and greedy continuations") {
  for (const std::string name : {"tiny-tied-f32", "tiny-untied-f32-sharded", "tiny-tied-bf16"}) {
    CAPTURE(name);
    const auto dir = dapo::test::qwen_fixture(name);
    if (!dir) return;
    CHECK(qwen::Config::from_file(*dir / "config.json").tie_word_embeddings ==
          (name.find("untied") == std::string::npos));
    check_within_float32_tolerances(compare_with_golden(*dir, torch::kCPU));
  }
}

TEST_CASE("transformers' own outputs on a tiny Qwen2 model (and on our trainer's checkpoint) are reproduced") {
  const auto dirs = transformers_goldens();
  if (dirs.empty()) {
    MESSAGE(
        "skipped: tests/fixtures/transformers/expected.json is missing from this checkout (it is committed; "
        "tests/fixtures/transformers_golden.py new makes it) and DAPO_TRANSFORMERS_GOLDENS names nothing");
    return;
  }
  for (const auto& dir : dirs) {
    CAPTURE(dir);
    const GoldenErrors errors = compare_with_golden(dir, torch::kCPU);
    MESSAGE("transformers golden " << dir.filename().string() << " on cpu: " << describe(errors));
    check_within_float32_tolerances(errors);
  }
}

TEST_CASE("on CUDA: the tiny checkpoints and transformers' goldens within the same float32 tolerances as on CPU") {
  if (!torch::cuda::is_available()) {
    MESSAGE("skipped: no CUDA device (scripts/device-check.sh runs this on a GPU machine)");
    return;
  }
  std::vector<std::filesystem::path> dirs = transformers_goldens();
  for (const std::string name : {"tiny-tied-f32", "tiny-untied-f32-sharded", "tiny-tied-bf16"}) {
    if (const auto dir = dapo::test::qwen_fixture(name)) dirs.push_back(*dir);
  }
  for (const auto& dir : dirs) {
    CAPTURE(dir);
    const GoldenErrors errors = compare_with_golden(dir, torch::Device(torch::kCUDA, 0));
    MESSAGE("golden " << dir.filename().string() << " on cuda: " << describe(errors));
    check_within_float32_tolerances(errors);
  }
}

TEST_CASE("a saved model reloads with identical logits, single file and sharded, float32 and bfloat16") {
  const auto dir = dapo::test::qwen_fixture("tiny-untied-f32-sharded");
  if (!dir) return;
  auto model = qwen::load_model(*dir);
  const Golden golden = read_golden(*dir);
  const torch::Tensor logits = model->forward(golden.input_ids, golden.attention_mask, golden.position_ids);
  for (const int64_t shard_bytes : {int64_t{0}, int64_t{100'000}}) {
    dapo::test::ScratchDir scratch;
    qwen::save_model(model, scratch.path(), {.max_shard_bytes = shard_bytes});
    CHECK(
        std::filesystem::exists(scratch.path() / (shard_bytes ? "model.safetensors.index.json" : "model.safetensors")));
    auto reloaded = qwen::load_model(scratch.path());
    CHECK(torch::equal(reloaded->forward(golden.input_ids, golden.attention_mask, golden.position_ids), logits));
  }
  // bfloat16 weights: saved as BF16, reloaded bit for bit.
  model->to(torch::kBFloat16);
  dapo::test::ScratchDir scratch;
  qwen::save_model(model, scratch.path());
  CHECK(dapo::test::read_json(scratch.path() / "config.json").at("torch_dtype") == "bfloat16");
  auto reloaded = qwen::load_model(scratch.path(), torch::kBFloat16);
  for (const auto& item : model->named_parameters()) {
    CHECK(torch::equal(reloaded->named_parameters()[item.key()], item.value()));
  }
}

TEST_CASE("bfloat16 weights run end to end with float32 norms and softmax, close to float32") {
  const auto dir = dapo::test::qwen_fixture("tiny-tied-bf16");
  if (!dir) return;
  const Golden golden = read_golden(*dir);
  auto model = qwen::load_model(*dir, torch::kBFloat16);
  const torch::Tensor logits = model->forward(golden.input_ids, golden.attention_mask, golden.position_ids);
  CHECK(dapo::test::dtype_name(logits) == "BFloat16");
  const torch::Tensor real = golden.attention_mask.to(torch::kBool).unsqueeze(-1);
  const double error = (logits.to(torch::kFloat64) - golden.logits).abs().masked_select(real).max().item<double>();
  const double scale = golden.logits.abs().max().item<double>();
  CHECK(error < 0.05 * scale);
}

TEST_CASE(
    "RoPE's inverse frequencies: a float32 buffer of the model (moved with it), out of checkpoints, never copied") {
  qwen::Qwen2ForCausalLM model(dapo::test::tiny_qwen_config(32, 16, 2, 1, 1));  // rope_theta 10000
  const auto buffers = model->named_buffers();
  REQUIRE(buffers.contains("model.rotary_emb.inv_freq"));  // Hugging Face's name
  const torch::Tensor inv_freq = buffers["model.rotary_emb.inv_freq"];
  CHECK(inv_freq.dim() == 1);
  CHECK(inv_freq.size(0) == 4);  // head_dim / 2
  CHECK(inv_freq[1].item<float>() == doctest::Approx(std::pow(10000.0, -2.0 / 8.0)));
  CHECK_FALSE(model->named_parameters().contains("model.rotary_emb.inv_freq"));  // parameters are what is saved

  model->to(torch::kFloat64);  // the weights change dtype, the angles stay float32 as in Hugging Face
  CHECK(dapo::test::dtype_name(model->lm_head_weight()) == "Double");
  CHECK(dapo::test::dtype_name(model->model->rotary_emb->inv_freq) == "Float");
  // Positions on another device than the model are refused, not met by copying the table there in every forward (what
  // a CUDA decode step used to do from the host). The meta device stands in for a GPU here.
  const auto ids = torch::zeros({1, 3}, torch::TensorOptions().dtype(torch::kInt64).device(torch::kMeta));
  CHECK_THROWS_WITH_AS(model->model->rotary_emb(ids), doctest::Contains("but the model is on cpu"), c10::Error);
}
