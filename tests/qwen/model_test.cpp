// The Qwen2 model against the tiny golden checkpoints: logits and target log-probs (1e-4), NLL gradients (1e-4
// relative), greedy continuations with and without the KV cache, batched (left-padded) and one by one.
#include <torch/torch.h>

#include "qwen_gsm8k/model/generation.hpp"
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
  return (actual.to(torch::kFloat64) - expected).norm().item<double>() / expected.norm().item<double>();
}

}  // namespace

TEST_CASE("the three tiny checkpoints load and reproduce logits, log-probs, NLL gradients and greedy continuations") {
  for (const std::string name : {"tiny-tied-f32", "tiny-untied-f32-sharded", "tiny-tied-bf16"}) {
    CAPTURE(name);
    const auto dir = dapo::test::qwen_fixture(name);
    if (!dir) return;
    const Golden golden = read_golden(*dir);
    auto model = qwen::load_model(*dir);
    CHECK(model->config().tie_word_embeddings == (name.find("untied") == std::string::npos));

    // Position ids from the mask, as generation makes them.
    CHECK(torch::equal(qwen::position_ids_from_mask(golden.attention_mask), golden.position_ids));

    const torch::Tensor logits = model->forward(golden.input_ids, golden.attention_mask, golden.position_ids);
    const torch::Tensor real = golden.attention_mask.to(torch::kBool);
    const double logits_error =
        (logits.to(torch::kFloat64) - golden.logits).abs().masked_select(real.unsqueeze(-1)).max().item<double>();
    CHECK(logits_error < 1e-4);
    // The last position alone, as generation asks for it: the same bits.
    CHECK(torch::equal(model->last_logits(golden.input_ids, golden.attention_mask, golden.position_ids),
                       logits.select(1, -1)));

    // log-softmax at t, taken at token t + 1; the NLL averages pairs where both positions are real tokens.
    const torch::Tensor log_probs = logits.log_softmax(-1);
    const int64_t steps = logits.size(1) - 1;
    const torch::Tensor targets = golden.input_ids.narrow(1, 1, steps);
    const torch::Tensor target_logprobs = log_probs.narrow(1, 0, steps).gather(-1, targets.unsqueeze(-1)).squeeze(-1);
    const torch::Tensor pairs = real.narrow(1, 0, steps) & real.narrow(1, 1, steps);
    CHECK(
        (target_logprobs.to(torch::kFloat64) - golden.target_logprobs).abs().masked_select(pairs).max().item<double>() <
        1e-4);
    const torch::Tensor nll = -(target_logprobs.masked_select(pairs)).mean();
    CHECK(nll.item<double>() == doctest::Approx(golden.nll).epsilon(1e-5));

    nll.backward();
    std::map<std::string, torch::Tensor> parameters;
    for (const auto& item : model->named_parameters()) parameters[item.key()] = item.value();
    for (const auto& [parameter_name, values] : golden.grads.items()) {
      CAPTURE(parameter_name);
      REQUIRE(parameters.count(parameter_name));
      const torch::Tensor expected = torch::tensor(dapo::test::flatten(values), torch::kFloat64)
                                         .reshape(golden.grad_shapes.at(parameter_name).get<std::vector<int64_t>>());
      CHECK(relative_error(parameters[parameter_name].grad(), expected) < 1e-4);
    }

    // Greedy continuations: batched and left-padded, one by one, with and without the cache.
    const auto prompts = golden.greedy.at("prompts").get<std::vector<std::vector<int64_t>>>();
    const auto expected = golden.greedy.at("continuations").get<std::vector<std::vector<int64_t>>>();
    qwen::GenerationOptions options;
    options.max_new_tokens = golden.greedy.at("new_tokens");
    options.sampling.temperature = 0.0;
    for (const bool use_cache : {true, false}) {
      CAPTURE(use_cache);
      options.use_cache = use_cache;
      const auto batched = qwen::generate(model, prompts, options);
      for (std::size_t b = 0; b < prompts.size(); ++b) {
        const auto row = batched.tokens[static_cast<int64_t>(b)];
        CHECK(std::vector<int64_t>(row.data_ptr<int64_t>(), row.data_ptr<int64_t>() + row.numel()) == expected[b]);
        const auto alone = qwen::generate(model, {prompts[b]}, options);
        CHECK(torch::equal(alone.tokens[0], row));
      }
      CHECK(batched.truncated.all().item<bool>());
    }
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
