// Attention over packed sequences with no padding and no mask: FlashAttention's variable-length form.
//
// The queries of every sequence lie packed one after another, [tokens, N, D]; each sequence's keys and values, packed
// the same way, [keys, KV, D], may be more than its queries: a response of a shared-prompt batch has its prompt's keys
// and then its own. Query i of a sequence with q queries and k keys sees keys 0 .. k - q + i (causal, aligned to the
// end of its keys, as FlashAttention 2 aligns it). On CUDA this is one ATen call (_flash_attention_forward, whose
// backward is ATen's too), in place of padding every row to the longest, a materialised [rows, 1, R, P + R] mask that
// the backward keeps, and the memory-efficient kernel that a mask forces: verl's use_remove_padding with its
// FlashAttention varlen call, for the shared-prompt forward.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <vector>

namespace qwen {

// The sequences of a packed batch, on the host: for each sequence in turn, the packed tokens its keys are.
struct VarlenLayout {
  std::vector<int64_t> key_tokens;    // [keys]: the packed token each key position reads
  std::vector<int64_t> query_starts;  // [sequences + 1]: where each sequence's queries begin among the tokens
  std::vector<int64_t> key_starts;    // [sequences + 1]: where each sequence's keys begin in key_tokens
  int64_t max_queries = 0, max_keys = 0;
};

// A shared-prompt batch's layout (SharedPromptBatch's packing: every prompt's tokens, then every response row's):
// each prompt attends to itself; each response row (with at least one token) to its prompt's tokens, then its own.
VarlenLayout shared_prompt_layout(const std::vector<int64_t>& prompt_lengths,
                                  const std::vector<int64_t>& response_lengths, const std::vector<int64_t>& row_prompt);

// The layout on a device, as the kernel takes it.
struct VarlenInputs {
  torch::Tensor key_tokens;                                 // [keys] int64
  torch::Tensor query_starts, key_starts;                   // [sequences + 1] int32
  std::vector<int64_t> host_query_starts, host_key_starts;  // the same on the host (the reference's loop)
  int64_t max_queries = 0, max_keys = 0;
  bool defined() const { return key_tokens.defined(); }
};

// The layout's tensors on `device`, in one host-to-device copy (host_door).
VarlenInputs varlen_inputs(const VarlenLayout& layout, torch::Device device);

// query [tokens, N, D]; key, value [keys, KV, D] (KV dividing N; each the layout's keys, gathered) -> [tokens, N, D]:
// FlashAttention's variable-length kernel, with its backward. Half precision on CUDA only (varlen_attention_usable).
torch::Tensor varlen_attention(const torch::Tensor& query, const torch::Tensor& key, const torch::Tensor& value,
                               const VarlenInputs& inputs);

// The same in float32 products and softmax, one sequence at a time, on any device: the reference that the tests and
// varlen_attention_usable compare the kernel with. Output in query's dtype.
torch::Tensor varlen_attention_reference(const torch::Tensor& query, const torch::Tensor& key,
                                         const torch::Tensor& value, const VarlenInputs& inputs);

// Whether varlen_attention runs on `device` in `dtype` with these heads: LibTorch 2.4 or later, a CUDA device,
// bfloat16 or float16, a head size FlashAttention takes, and a first call at a small shape (forward and backward)
// that runs and agrees with the reference (checked once per device, dtype and shape of heads; a failure is reported
// once on stderr and the masked path is used).
bool varlen_attention_usable(torch::Device device, torch::ScalarType dtype, int64_t heads, int64_t kv_heads,
                             int64_t head_dim);

// Which attention the shared-prompt forward takes.
enum class SharedAttention {
  kAuto,       // varlen_attention where usable, else padded rows with a mask (the CPU's path)
  kMasked,     // padded rows with a mask, everywhere
  kReference,  // varlen_attention_reference, everywhere (tests of the layout on the CPU)
};

// The choice while an instance lives (process-wide: checkpointed recomputes run on the autograd engine's threads; one
// at a time), for comparisons in tests and benches.
class SharedAttentionChoice {
 public:
  explicit SharedAttentionChoice(SharedAttention choice);
  ~SharedAttentionChoice();
  SharedAttentionChoice(const SharedAttentionChoice&) = delete;
  SharedAttentionChoice& operator=(const SharedAttentionChoice&) = delete;

 private:
  SharedAttention previous_;
};

SharedAttention shared_attention_choice();

}  // namespace qwen
