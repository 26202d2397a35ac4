// Attention over packed sequences (see the header).
#include "qwen_gsm8k/model/varlen_attention.hpp"

#include <torch/torch.h>
#include <torch/version.h>

#include <atomic>
#include <cmath>
#include <iostream>
#include <map>
#include <mutex>
#include <tuple>

#include "qwen_gsm8k/model/autocast.hpp"
#include "qwen_gsm8k/model/host_door.hpp"

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
#define QWEN_HAS_FLASH_VARLEN 1
#include <ATen/ops/_flash_attention_forward.h>
#else
#define QWEN_HAS_FLASH_VARLEN 0
#endif

namespace qwen {
namespace {

using torch::Tensor;

std::atomic<SharedAttention>& choice() {
  static std::atomic<SharedAttention> value{SharedAttention::kAuto};
  return value;
}

// This thread's autocast off for `type` while it lives: the reference computes in float32 as written.
class NoAutocast {
 public:
  explicit NoAutocast(c10::DeviceType type) : saved_(autocast_state::Saved::of(type)) {
    autocast_state::set(type, false, saved_.dtype);
  }
  ~NoAutocast() { saved_.restore(); }
  NoAutocast(const NoAutocast&) = delete;
  NoAutocast& operator=(const NoAutocast&) = delete;

 private:
  autocast_state::Saved saved_;
};

// A small shared-prompt batch at the layers' shapes, with values from a formula (no random generator is drawn from):
// a prompt of 5 tokens with two responses of 3 and 4, packed [12, N + 2 KV, D]; varlen_attention's output and the
// packed tensor's gradient against the reference's. Returns the largest difference relative to the reference's
// largest value, of the outputs and the gradients (one counted host read).
double probe_difference(torch::Device device, torch::ScalarType dtype, int64_t heads, int64_t kv_heads,
                        int64_t head_dim) {
  const torch::AutoGradMode grad_mode(true);
  const NoAutocast no_autocast(device.type());
  const VarlenInputs inputs = varlen_inputs(shared_prompt_layout({5}, {3, 4}, {0, 0}), device);
  const int64_t tokens = 12, width = heads + 2 * kv_heads;
  const auto options = torch::TensorOptions().device(device).dtype(torch::kFloat32);
  const Tensor values =
      torch::sin(torch::arange(tokens * width * head_dim, options) * 0.37).view({tokens, width, head_dim}).to(dtype);
  const Tensor weights =
      torch::cos(torch::arange(tokens * heads * head_dim, options) * 0.11).view({tokens, heads, head_dim});
  const auto run = [&](bool kernel) {
    const Tensor packed = values.detach().requires_grad_(true);
    const Tensor key_value = packed.narrow(1, heads, 2 * kv_heads).index_select(0, inputs.key_tokens);
    const Tensor query = packed.narrow(1, 0, heads), key = key_value.narrow(1, 0, kv_heads),
                 value = key_value.narrow(1, kv_heads, kv_heads);
    const Tensor out =
        kernel ? varlen_attention(query, key, value, inputs) : varlen_attention_reference(query, key, value, inputs);
    (out.to(torch::kFloat32) * weights).sum().backward();
    return std::make_pair(out.detach().to(torch::kFloat32), packed.grad().to(torch::kFloat32));
  };
  const auto [out, grad] = run(true);
  const auto [reference_out, reference_grad] = run(false);
  const auto relative = [](const Tensor& a, const Tensor& b) {
    return (a - b).abs().max() / torch::clamp_min(b.abs().max(), 1.0);
  };
  const Tensor differences = torch::stack({relative(out, reference_out), relative(grad, reference_grad)});
  return host_door::read(differences.max()).item<double>();
}

}  // namespace

VarlenLayout shared_prompt_layout(const std::vector<int64_t>& prompt_lengths,
                                  const std::vector<int64_t>& response_lengths,
                                  const std::vector<int64_t>& row_prompt) {
  TORCH_CHECK(row_prompt.size() == response_lengths.size(), "shared_prompt_layout: ", row_prompt.size(),
              " row prompts for ", response_lengths.size(), " responses");
  VarlenLayout layout;
  layout.query_starts.push_back(0);
  layout.key_starts.push_back(0);
  const auto add_sequence = [&](int64_t queries) {
    layout.query_starts.push_back(layout.query_starts.back() + queries);
    layout.key_starts.push_back(static_cast<int64_t>(layout.key_tokens.size()));
    layout.max_queries = std::max(layout.max_queries, queries);
    layout.max_keys = std::max(layout.max_keys, layout.key_starts.back() - *(layout.key_starts.end() - 2));
  };
  const auto add_keys = [&](int64_t first, int64_t count) {
    for (int64_t t = first; t < first + count; ++t) layout.key_tokens.push_back(t);
  };
  std::vector<int64_t> prompt_starts;
  int64_t token = 0;
  for (const int64_t length : prompt_lengths) {
    TORCH_CHECK(length >= 1, "shared_prompt_layout: a prompt of ", length, " tokens");
    prompt_starts.push_back(token);
    add_keys(token, length);
    add_sequence(length);
    token += length;
  }
  for (std::size_t r = 0; r < response_lengths.size(); ++r) {
    const int64_t length = response_lengths[r], p = row_prompt[r];
    TORCH_CHECK(length >= 0, "shared_prompt_layout: response ", r, " has ", length, " tokens");
    TORCH_CHECK(p >= 0 && p < static_cast<int64_t>(prompt_lengths.size()), "shared_prompt_layout: response ", r,
                " continues prompt ", p, " of ", prompt_lengths.size());
    if (length == 0) continue;  // no queries: not a sequence
    add_keys(prompt_starts[static_cast<std::size_t>(p)], prompt_lengths[static_cast<std::size_t>(p)]);
    add_keys(token, length);
    add_sequence(length);
    token += length;
  }
  return layout;
}

VarlenInputs varlen_inputs(const VarlenLayout& layout, torch::Device device) {
  std::vector<int64_t> values = layout.key_tokens;
  values.insert(values.end(), layout.query_starts.begin(), layout.query_starts.end());
  values.insert(values.end(), layout.key_starts.begin(), layout.key_starts.end());
  const Tensor all = host_door::to_device(values, device);
  const auto keys = static_cast<int64_t>(layout.key_tokens.size());
  const auto starts = static_cast<int64_t>(layout.query_starts.size());
  VarlenInputs inputs;
  inputs.key_tokens = all.narrow(0, 0, keys);
  inputs.query_starts = all.narrow(0, keys, starts).to(torch::kInt32);
  inputs.key_starts = all.narrow(0, keys + starts, starts).to(torch::kInt32);
  inputs.host_query_starts = layout.query_starts;
  inputs.host_key_starts = layout.key_starts;
  inputs.max_queries = layout.max_queries;
  inputs.max_keys = layout.max_keys;
  return inputs;
}

Tensor varlen_attention(const Tensor& query, const Tensor& key, const Tensor& value, const VarlenInputs& inputs) {
#if QWEN_HAS_FLASH_VARLEN
  return std::get<0>(at::_flash_attention_forward(query, key, value, inputs.query_starts, inputs.key_starts,
                                                  inputs.max_queries, inputs.max_keys, /*dropout_p=*/0.0,
                                                  /*is_causal=*/true, /*return_debug_mask=*/false));
#else
  (void)query, (void)key, (void)value, (void)inputs;
  TORCH_CHECK(false, "varlen_attention: FlashAttention's variable-length call needs LibTorch 2.4 or later");
#endif
}

Tensor varlen_attention_reference(const Tensor& query, const Tensor& key, const Tensor& value,
                                  const VarlenInputs& inputs) {
  TORCH_CHECK(query.dim() == 3 && key.dim() == 3 && value.sizes() == key.sizes() && query.size(2) == key.size(2) &&
                  query.size(1) % key.size(1) == 0,
              "varlen_attention_reference: query ", query.sizes(), ", key ", key.sizes(), ", value ", value.sizes(),
              ", expected [tokens, N, D] and [keys, KV, D] with KV dividing N");
  const NoAutocast no_autocast(query.device().type());
  const int64_t groups = query.size(1) / key.size(1);
  const double scale = 1.0 / std::sqrt(static_cast<double>(query.size(2)));
  const auto options = query.options().dtype(torch::kInt64);
  std::vector<Tensor> outputs;
  for (std::size_t s = 0; s + 1 < inputs.host_query_starts.size(); ++s) {
    const int64_t q0 = inputs.host_query_starts[s], queries = inputs.host_query_starts[s + 1] - q0;
    const int64_t k0 = inputs.host_key_starts[s], keys = inputs.host_key_starts[s + 1] - k0;
    const auto heads_first = [](const Tensor& x) { return x.transpose(0, 1).to(torch::kFloat32); };  // [heads, n, D]
    const Tensor q = heads_first(query.narrow(0, q0, queries));
    const Tensor k = heads_first(key.narrow(0, k0, keys)).repeat_interleave(groups, 0);
    const Tensor v = heads_first(value.narrow(0, k0, keys)).repeat_interleave(groups, 0);
    // Query i sees keys 0 .. keys - queries + i.
    const Tensor hidden =
        torch::arange(keys, options).unsqueeze(0) > torch::arange(queries, options).unsqueeze(1) + (keys - queries);
    const Tensor scores = torch::matmul(q, k.transpose(1, 2)).mul(scale).masked_fill(hidden, -INFINITY);
    outputs.push_back(torch::matmul(torch::softmax(scores, -1), v).transpose(0, 1));
  }
  if (outputs.empty()) return query.new_empty(query.sizes());
  return torch::cat(outputs, 0).to(query.scalar_type());
}

bool varlen_attention_usable(torch::Device device, torch::ScalarType dtype, int64_t heads, int64_t kv_heads,
                             int64_t head_dim) {
  if (!QWEN_HAS_FLASH_VARLEN || !device.is_cuda()) return false;
  if (dtype != torch::kBFloat16 && dtype != torch::kFloat16) return false;
  if (head_dim % 8 != 0 || head_dim > 256 || kv_heads < 1 || heads % kv_heads != 0) return false;
  static std::mutex mutex;
  static std::map<std::tuple<int, int, int64_t, int64_t, int64_t>, bool> known;
  const std::lock_guard<std::mutex> lock(mutex);
  const auto key =
      std::make_tuple(static_cast<int>(device.index()), static_cast<int>(dtype), heads, kv_heads, head_dim);
  if (const auto found = known.find(key); found != known.end()) return found->second;
  bool usable = false;
  try {
    const double difference = probe_difference(device, dtype, heads, kv_heads, head_dim);
    usable = difference <= 3e-2;
    if (!usable) {
      std::cerr << "qwen_gsm8k: FlashAttention's variable-length call differs from the reference by " << difference
                << " (relative) on " << device << "; the shared-prompt forward pads and masks instead\n";
    }
  } catch (const c10::Error& error) {
    std::cerr << "qwen_gsm8k: FlashAttention's variable-length call is not available on " << device << " ("
              << error.what_without_backtrace() << "); the shared-prompt forward pads and masks instead\n";
  } catch (const std::exception& error) {
    std::cerr << "qwen_gsm8k: FlashAttention's variable-length call failed on " << device << " (" << error.what()
              << "); the shared-prompt forward pads and masks instead\n";
  }
  known.emplace(key, usable);
  return usable;
}

SharedAttentionChoice::SharedAttentionChoice(SharedAttention value) : previous_(choice().exchange(value)) {}

SharedAttentionChoice::~SharedAttentionChoice() {
  choice().store(previous_);
}

SharedAttention shared_attention_choice() {
  return choice().load();
}

}  // namespace qwen
