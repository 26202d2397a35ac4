// The training forward's fused operators (see the header): their dispatcher schemas, the composites every device runs,
// and the autograd nodes that tie each forward to its backward operator.
#include "qwen_gsm8k/model/fused_training.hpp"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/accumulate.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "dapo/detail/autograd_node.hpp"
#include "qwen_gsm8k/model/autocast.hpp"
#include "qwen_gsm8k/model/fused_ops.hpp"

#if DAPO_DRIVER_CUDA_KERNELS
#include "qwen_gsm8k/model/fused_training_kernels.hpp"
#endif

namespace qwen::fused {
namespace {

using torch::Tensor;
using torch::autograd::SavedVariable;
using torch::autograd::variable_list;

Tensor as_float(const Tensor& x) {
  return x.scalar_type() == at::kFloat ? x : x.to(at::kFloat);
}

// --- RMSNorm ------------------------------------------------------------------------------------------------------

void check_norm(const char* op, const Tensor& x, const Tensor& weight) {
  TORCH_CHECK(x.dim() >= 1 && weight.dim() == 1 && x.size(-1) == weight.size(0), "qwen::", op, ": x has shape ",
              x.sizes(), " and weight ", weight.sizes(), ", expected [..., H] and [H]");
}

// normed = (weight * rms_norm(x)) in out_dtype; inverse = 1 / rms(x) [..., 1] float32, kept for the backward.
std::tuple<Tensor, Tensor> composite_rms_norm_forward(const Tensor& x, const Tensor& weight, double eps,
                                                      at::ScalarType out_dtype) {
  check_norm("rms_norm_forward", x, weight);
  const Tensor h = as_float(x);
  Tensor inverse = at::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + eps);
  Tensor normed = h * inverse;
  if (x.scalar_type() != at::kFloat) normed = normed.to(x.scalar_type());
  Tensor out = weight * normed;
  if (out.scalar_type() != out_dtype) out = out.to(out_dtype);
  return {std::move(out), std::move(inverse)};
}

std::tuple<Tensor, Tensor, Tensor> composite_add_rms_norm_forward(const Tensor& x, const Tensor& residual,
                                                                  const Tensor& weight, double eps,
                                                                  at::ScalarType out_dtype) {
  TORCH_CHECK(x.sizes() == residual.sizes(), "qwen::add_rms_norm_forward: x has shape ", x.sizes(), " but residual ",
              residual.sizes());
  Tensor sum = residual + x;
  auto [normed, inverse] = composite_rms_norm_forward(sum, weight, eps, out_dtype);
  return {std::move(normed), std::move(sum), std::move(inverse)};
}

// The norm's backward, with r = inverse and n = x r (float32): d weight = sum over rows of (dy n),
// d x = r (dy weight - n mean(dy weight n)) (+ grad_sum, the gradient the sum has from its other uses), in x's dtype.
std::tuple<Tensor, Tensor> composite_rms_norm_backward(const Tensor& grad, const c10::optional<Tensor>& grad_sum,
                                                       const Tensor& x, const Tensor& weight, const Tensor& inverse,
                                                       bool input_grad, bool weight_grad) {
  check_norm("rms_norm_backward", x, weight);
  TORCH_CHECK(grad.sizes() == x.sizes() && inverse.dim() == x.dim() && inverse.size(-1) == 1,
              "qwen::rms_norm_backward: grad ", grad.sizes(), ", x ", x.sizes(), " and inverse ", inverse.sizes(),
              ", expected [..., H], [..., H] and [..., 1]");
  const Tensor dy = as_float(grad);
  const Tensor n = as_float(x) * inverse;
  Tensor grad_x, grad_weight;
  if (weight_grad) {
    std::vector<int64_t> rows(static_cast<std::size_t>(x.dim() - 1));
    for (std::size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<int64_t>(i);
    grad_weight = (dy * n).sum(rows);
    if (grad_weight.scalar_type() != weight.scalar_type()) grad_weight = grad_weight.to(weight.scalar_type());
  }
  if (input_grad) {
    const Tensor dn = dy * weight;
    grad_x = inverse * (dn - n * (dn * n).mean(-1, /*keepdim=*/true));
    if (grad_sum.has_value() && grad_sum->defined()) grad_x = grad_x + *grad_sum;
    if (grad_x.scalar_type() != x.scalar_type()) grad_x = grad_x.to(x.scalar_type());
  }
  return {std::move(grad_x), std::move(grad_weight)};
}

// --- silu(gate) * up ----------------------------------------------------------------------------------------------

// ATen's autograd of the unfused calls, in one operator: d up = dy silu(gate), d gate = silu'(gate) (dy up).
Tensor composite_silu_and_mul_backward(const Tensor& grad, const Tensor& gate_up) {
  TORCH_CHECK(gate_up.dim() >= 1 && gate_up.size(-1) % 2 == 0 && grad.dim() == gate_up.dim() &&
                  grad.size(-1) * 2 == gate_up.size(-1),
              "qwen::silu_and_mul_backward: grad ", grad.sizes(), " and gate_up ", gate_up.sizes(),
              ", expected [..., I] and [..., 2 I]");
  const std::vector<Tensor> halves = gate_up.chunk(2, -1);
  return at::cat({at::silu_backward(grad * halves[1], halves[0]), grad * at::silu(halves[0])}, -1);
}

// --- RoPE on the q/k/v product ------------------------------------------------------------------------------------

struct RotaryShape {
  int64_t batch, positions, width, head_dim;
};

RotaryShape rotary_shape(const char* op, at::IntArrayRef product, const Tensor& cos, const Tensor& signed_sin,
                         int64_t heads, int64_t kv_heads, bool packed) {
  TORCH_CHECK(heads > 0 && kv_heads > 0 && (product.size() == 3 || (product.size() == 2 && packed)), "qwen::", op,
              ": product has shape ", product, ", expected [B, T, W D]", (packed ? " or [T, W D]" : ""));
  const int64_t width = heads + 2 * kv_heads;
  const int64_t batch = product.size() == 3 ? product[0] : 1, positions = product[product.size() - 2];
  const int64_t columns = product.back();
  TORCH_CHECK(columns % width == 0 && (columns / width) % 2 == 0, "qwen::", op, ": product has ", columns,
              " columns, expected ", width, " heads of an even dimension");
  const int64_t head_dim = columns / width;
  TORCH_CHECK(cos.numel() == batch * positions * head_dim && signed_sin.numel() == cos.numel() && cos.is_contiguous() &&
                  signed_sin.is_contiguous(),
              "qwen::", op, ": cos ", cos.sizes(), " and signed_sin ", signed_sin.sizes(), " must be contiguous with ",
              batch, " x ", positions, " x ", head_dim, " elements");
  return {batch, positions, width, head_dim};
}

// [B, T, W, D]: x cos + roll(x, D / 2) signed_sin on the N + KV rotated heads, the value heads as they are.
Tensor rotated_heads(const Tensor& product, const Tensor& cos, const Tensor& signed_sin, int64_t heads,
                     int64_t kv_heads, const RotaryShape& s) {
  const Tensor x = product.reshape({s.batch, s.positions, s.width, s.head_dim});
  const std::vector<Tensor> qk_v = x.split_with_sizes({heads + kv_heads, kv_heads}, 2);
  const Tensor rotated = rotary(qk_v[0], cos.view({s.batch, s.positions, 1, s.head_dim}),
                                signed_sin.view({s.batch, s.positions, 1, s.head_dim}));
  return at::cat({rotated, qk_v[1]}, 2);
}

// d product for dy [B, T, W, D]: d x = dy cos + roll(dy signed_sin, D / 2) on the rotated heads (a roll by half a
// head is its own inverse), dy itself on the value heads.
Tensor rotated_heads_backward(const Tensor& dy, const Tensor& cos, const Tensor& signed_sin, int64_t heads,
                              int64_t kv_heads, const RotaryShape& s, at::IntArrayRef product_shape) {
  const std::vector<Tensor> qk_v = dy.split_with_sizes({heads + kv_heads, kv_heads}, 2);
  const Tensor c = cos.view({s.batch, s.positions, 1, s.head_dim});
  const Tensor ss = signed_sin.view({s.batch, s.positions, 1, s.head_dim});
  const Tensor dx = qk_v[0] * c + (qk_v[0] * ss).roll(s.head_dim / 2, -1);
  return at::cat({dx, qk_v[1]}, 2).view(product_shape);
}

// The packed form: [B, T, W, D] ([T, W, D] for a 2-D product).
Tensor composite_rotary_qkv(const Tensor& product, const Tensor& cos, const Tensor& signed_sin, int64_t heads,
                            int64_t kv_heads) {
  const RotaryShape s = rotary_shape("rotary_qkv", product.sizes(), cos, signed_sin, heads, kv_heads, true);
  const Tensor out = rotated_heads(product, cos, signed_sin, heads, kv_heads, s);
  return product.dim() == 2 ? out.view({s.positions, s.width, s.head_dim}) : out;
}

Tensor composite_rotary_qkv_backward(const Tensor& grad, const Tensor& cos, const Tensor& signed_sin, int64_t heads,
                                     int64_t kv_heads, at::IntArrayRef product_shape) {
  const RotaryShape s = rotary_shape("rotary_qkv_backward", product_shape, cos, signed_sin, heads, kv_heads, true);
  const Tensor dy = grad.view({s.batch, s.positions, s.width, s.head_dim});
  return rotated_heads_backward(dy, cos, signed_sin, heads, kv_heads, s, product_shape);
}

// The heads-first form: q [B, N, T, D], k and v [B, KV, T, D], each contiguous (SDPA's operands).
std::tuple<Tensor, Tensor, Tensor> composite_rotary_qkv_heads(const Tensor& product, const Tensor& cos,
                                                              const Tensor& signed_sin, int64_t heads,
                                                              int64_t kv_heads) {
  const RotaryShape s = rotary_shape("rotary_qkv_heads", product.sizes(), cos, signed_sin, heads, kv_heads, false);
  const std::vector<Tensor> q_k_v = rotated_heads(product, cos, signed_sin, heads, kv_heads, s)
                                        .transpose(1, 2)
                                        .split_with_sizes({heads, kv_heads, kv_heads}, 1);
  return {q_k_v[0].contiguous(), q_k_v[1].contiguous(), q_k_v[2].contiguous()};
}

// Gradients of q, k, v (an undefined one: zero) -> d product.
Tensor composite_rotary_qkv_heads_backward(const c10::optional<Tensor>& grad_q, const c10::optional<Tensor>& grad_k,
                                           const c10::optional<Tensor>& grad_v, const Tensor& cos,
                                           const Tensor& signed_sin, int64_t heads, int64_t kv_heads,
                                           at::IntArrayRef product_shape) {
  const RotaryShape s =
      rotary_shape("rotary_qkv_heads_backward", product_shape, cos, signed_sin, heads, kv_heads, false);
  const c10::optional<Tensor>* given[] = {&grad_q, &grad_k, &grad_v};
  const int64_t counts[] = {heads, kv_heads, kv_heads};
  const Tensor* any = nullptr;
  for (const auto* grad : given) {
    if (grad->has_value() && (*grad)->defined()) any = &**grad;
  }
  TORCH_CHECK(any != nullptr, "qwen::rotary_qkv_heads_backward: no gradient given");
  std::vector<Tensor> parts;
  for (std::size_t i = 0; i < 3; ++i) {
    const bool defined = given[i]->has_value() && (*given[i])->defined();
    parts.push_back(defined ? **given[i] : at::zeros({s.batch, counts[i], s.positions, s.head_dim}, any->options()));
  }
  const Tensor dy = at::cat(parts, 1).transpose(1, 2);  // [B, T, W, D]
  return rotated_heads_backward(dy, cos, signed_sin, heads, kv_heads, s, product_shape);
}

TORCH_LIBRARY_FRAGMENT(qwen, m) {
  m.def("rms_norm_forward(Tensor x, Tensor weight, float eps, ScalarType out_dtype) -> (Tensor, Tensor)");
  m.def(
      "add_rms_norm_forward(Tensor x, Tensor residual, Tensor weight, float eps, ScalarType out_dtype) -> "
      "(Tensor, Tensor, Tensor)");
  m.def(
      "rms_norm_backward(Tensor grad, Tensor? grad_sum, Tensor x, Tensor weight, Tensor inverse, bool input_grad, "
      "bool weight_grad) -> (Tensor, Tensor)");
  m.def("silu_and_mul_backward(Tensor grad, Tensor gate_up) -> Tensor");
  m.def("rotary_qkv(Tensor product, Tensor cos, Tensor signed_sin, int heads, int kv_heads) -> Tensor");
  m.def(
      "rotary_qkv_backward(Tensor grad, Tensor cos, Tensor signed_sin, int heads, int kv_heads, int[] product_shape) "
      "-> Tensor");
  m.def(
      "rotary_qkv_heads(Tensor product, Tensor cos, Tensor signed_sin, int heads, int kv_heads) -> "
      "(Tensor, Tensor, Tensor)");
  m.def(
      "rotary_qkv_heads_backward(Tensor? grad_q, Tensor? grad_k, Tensor? grad_v, Tensor cos, Tensor signed_sin, "
      "int heads, int kv_heads, int[] product_shape) -> Tensor");
}

TORCH_LIBRARY_IMPL(qwen, CompositeExplicitAutograd, m) {
  m.impl("rms_norm_forward", &composite_rms_norm_forward);
  m.impl("add_rms_norm_forward", &composite_add_rms_norm_forward);
  m.impl("rms_norm_backward", &composite_rms_norm_backward);
  m.impl("silu_and_mul_backward", &composite_silu_and_mul_backward);
  m.impl("rotary_qkv", &composite_rotary_qkv);
  m.impl("rotary_qkv_backward", &composite_rotary_qkv_backward);
  m.impl("rotary_qkv_heads", &composite_rotary_qkv_heads);
  m.impl("rotary_qkv_heads_backward", &composite_rotary_qkv_heads_backward);
}

#if DAPO_DRIVER_CUDA_KERNELS
// The CUDA kernels where they take the inputs (float32, bfloat16 or float16, contiguous; the norms' sum in the
// residual's dtype), else the composites.
bool kernels_take(std::initializer_list<const Tensor*> tensors) {
  for (const Tensor* tensor : tensors) {
    if (tensor->defined() && (!training_kernels::takes(tensor->scalar_type()) || !tensor->is_contiguous())) {
      return false;
    }
  }
  return true;
}

Tensor inverse_like(const Tensor& x) {
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = 1;
  return at::empty(shape, x.options().dtype(at::kFloat));
}

std::tuple<Tensor, Tensor> cuda_rms_norm_forward(const Tensor& x, const Tensor& weight, double eps,
                                                 at::ScalarType out_dtype) {
  check_norm("rms_norm_forward", x, weight);
  if (!kernels_take({&x, &weight}) || !training_kernels::takes(out_dtype) || x.numel() == 0) {
    return composite_rms_norm_forward(x, weight, eps, out_dtype);
  }
  Tensor out = at::empty(x.sizes(), x.options().dtype(out_dtype)), inverse = inverse_like(x);
  training_kernels::rms_norm_forward(x, Tensor(), weight, eps, out, Tensor(), inverse);
  return {std::move(out), std::move(inverse)};
}

std::tuple<Tensor, Tensor, Tensor> cuda_add_rms_norm_forward(const Tensor& x, const Tensor& residual,
                                                             const Tensor& weight, double eps,
                                                             at::ScalarType out_dtype) {
  check_norm("add_rms_norm_forward", x, weight);
  const bool taken = kernels_take({&x, &residual, &weight}) && training_kernels::takes(out_dtype) &&
                     x.sizes() == residual.sizes() && x.numel() > 0 &&
                     at::promoteTypes(x.scalar_type(), residual.scalar_type()) == residual.scalar_type();
  if (!taken) return composite_add_rms_norm_forward(x, residual, weight, eps, out_dtype);
  Tensor out = at::empty(x.sizes(), x.options().dtype(out_dtype)), sum = at::empty_like(residual);
  Tensor inverse = inverse_like(x);
  training_kernels::rms_norm_forward(x, residual, weight, eps, out, sum, inverse);
  return {std::move(out), std::move(sum), std::move(inverse)};
}

std::tuple<Tensor, Tensor> cuda_rms_norm_backward(const Tensor& grad, const c10::optional<Tensor>& grad_sum,
                                                  const Tensor& x, const Tensor& weight, const Tensor& inverse,
                                                  bool input_grad, bool weight_grad) {
  const Tensor added = grad_sum.has_value() ? *grad_sum : Tensor();
  const bool taken = kernels_take({&grad, &added, &x, &weight, &inverse}) && inverse.scalar_type() == at::kFloat &&
                     grad.sizes() == x.sizes() && (!added.defined() || added.sizes() == x.sizes()) && x.dim() >= 1 &&
                     x.numel() > 0 && weight.dim() == 1 && weight.size(0) == x.size(-1) &&
                     inverse.numel() * x.size(-1) == x.numel();
  if (!taken) return composite_rms_norm_backward(grad, grad_sum, x, weight, inverse, input_grad, weight_grad);
  const int64_t hidden = x.size(-1), rows = x.numel() / hidden;
  Tensor grad_x = input_grad ? at::empty_like(x) : Tensor();
  // The weight's gradient as column sums over slices of 64 rows (at most 1,024 slices), summed once more by ATen.
  const int64_t slices = std::min<int64_t>((rows + 63) / 64, 1024);
  Tensor partials = weight_grad ? at::empty({slices, hidden}, x.options().dtype(at::kFloat)) : Tensor();
  training_kernels::rms_norm_backward(grad, added, x, weight, inverse, grad_x, partials);
  Tensor grad_weight;
  if (weight_grad) {
    grad_weight = partials.sum(0);
    if (weight.scalar_type() != at::kFloat) grad_weight = grad_weight.to(weight.scalar_type());
  }
  return {std::move(grad_x), std::move(grad_weight)};
}

Tensor cuda_silu_and_mul_backward(const Tensor& grad, const Tensor& gate_up) {
  const bool taken = kernels_take({&grad, &gate_up}) && grad.scalar_type() == gate_up.scalar_type() &&
                     gate_up.dim() >= 1 && grad.dim() == gate_up.dim() && grad.size(-1) * 2 == gate_up.size(-1) &&
                     grad.numel() * 2 == gate_up.numel();
  if (!taken) return composite_silu_and_mul_backward(grad, gate_up);
  Tensor out = at::empty_like(gate_up);
  training_kernels::silu_and_mul_backward(grad, gate_up, out);
  return out;
}

bool rotary_kernels_take(const Tensor& product, const Tensor& cos, const Tensor& signed_sin) {
  return kernels_take({&product, &cos, &signed_sin}) && cos.scalar_type() == product.scalar_type() &&
         signed_sin.scalar_type() == product.scalar_type() && product.numel() > 0;
}

Tensor cuda_rotary_qkv(const Tensor& product, const Tensor& cos, const Tensor& signed_sin, int64_t heads,
                       int64_t kv_heads) {
  const RotaryShape s = rotary_shape("rotary_qkv", product.sizes(), cos, signed_sin, heads, kv_heads, true);
  if (!rotary_kernels_take(product, cos, signed_sin)) {
    return composite_rotary_qkv(product, cos, signed_sin, heads, kv_heads);
  }
  std::vector<int64_t> shape(product.sizes().begin(), product.sizes().end() - 1);
  shape.push_back(s.width);
  shape.push_back(s.head_dim);
  Tensor out = at::empty(shape, product.options());
  training_kernels::rotary_qkv(product, cos, signed_sin, s.batch, heads, kv_heads, out, Tensor(), Tensor(), Tensor());
  return out;
}

std::tuple<Tensor, Tensor, Tensor> cuda_rotary_qkv_heads(const Tensor& product, const Tensor& cos,
                                                         const Tensor& signed_sin, int64_t heads, int64_t kv_heads) {
  const RotaryShape s = rotary_shape("rotary_qkv_heads", product.sizes(), cos, signed_sin, heads, kv_heads, false);
  if (!rotary_kernels_take(product, cos, signed_sin)) {
    return composite_rotary_qkv_heads(product, cos, signed_sin, heads, kv_heads);
  }
  Tensor q = at::empty({s.batch, heads, s.positions, s.head_dim}, product.options());
  Tensor k = at::empty({s.batch, kv_heads, s.positions, s.head_dim}, product.options()), v = at::empty_like(k);
  training_kernels::rotary_qkv(product, cos, signed_sin, s.batch, heads, kv_heads, Tensor(), q, k, v);
  return {std::move(q), std::move(k), std::move(v)};
}

Tensor cuda_rotary_qkv_backward(const Tensor& grad, const Tensor& cos, const Tensor& signed_sin, int64_t heads,
                                int64_t kv_heads, at::IntArrayRef product_shape) {
  const RotaryShape s = rotary_shape("rotary_qkv_backward", product_shape, cos, signed_sin, heads, kv_heads, true);
  if (!rotary_kernels_take(grad, cos, signed_sin) || grad.numel() != c10::multiply_integers(product_shape)) {
    return composite_rotary_qkv_backward(grad, cos, signed_sin, heads, kv_heads, product_shape);
  }
  Tensor out = at::empty(product_shape, grad.options());
  training_kernels::rotary_qkv_backward(grad, Tensor(), Tensor(), Tensor(), cos, signed_sin, s.batch, heads, kv_heads,
                                        out);
  return out;
}

Tensor cuda_rotary_qkv_heads_backward(const c10::optional<Tensor>& grad_q, const c10::optional<Tensor>& grad_k,
                                      const c10::optional<Tensor>& grad_v, const Tensor& cos, const Tensor& signed_sin,
                                      int64_t heads, int64_t kv_heads, at::IntArrayRef product_shape) {
  const RotaryShape s =
      rotary_shape("rotary_qkv_heads_backward", product_shape, cos, signed_sin, heads, kv_heads, false);
  // The gradients as the kernel reads them: contiguous, heads first (SDPA's backward may give other strides).
  const auto given = [](const c10::optional<Tensor>& grad) {
    return grad.has_value() && grad->defined() ? grad->contiguous() : Tensor();
  };
  const Tensor q = given(grad_q), k = given(grad_k), v = given(grad_v);
  const Tensor& any = q.defined() ? q : k.defined() ? k : v;
  const auto shaped = [&](const Tensor& grad, int64_t count) {
    return !grad.defined() || (grad.sizes() == at::IntArrayRef{s.batch, count, s.positions, s.head_dim} &&
                               grad.scalar_type() == any.scalar_type());
  };
  const bool taken = any.defined() && rotary_kernels_take(any, cos, signed_sin) && kernels_take({&q, &k, &v}) &&
                     shaped(q, heads) && shaped(k, kv_heads) && shaped(v, kv_heads);
  if (!taken) {
    return composite_rotary_qkv_heads_backward(grad_q, grad_k, grad_v, cos, signed_sin, heads, kv_heads, product_shape);
  }
  Tensor out = at::empty(product_shape, any.options());
  training_kernels::rotary_qkv_backward(Tensor(), q, k, v, cos, signed_sin, s.batch, heads, kv_heads, out);
  return out;
}
#endif

#if DAPO_DRIVER_CUDA_KERNELS
TORCH_LIBRARY_IMPL(qwen, CUDA, m) {
  m.impl("rms_norm_forward", &cuda_rms_norm_forward);
  m.impl("add_rms_norm_forward", &cuda_add_rms_norm_forward);
  m.impl("rms_norm_backward", &cuda_rms_norm_backward);
  m.impl("silu_and_mul_backward", &cuda_silu_and_mul_backward);
  m.impl("rotary_qkv", &cuda_rotary_qkv);
  m.impl("rotary_qkv_backward", &cuda_rotary_qkv_backward);
  m.impl("rotary_qkv_heads", &cuda_rotary_qkv_heads);
  m.impl("rotary_qkv_heads_backward", &cuda_rotary_qkv_heads_backward);
}
#endif

// The operators through the dispatcher (a profile counts one call each).
template <class Signature>
c10::TypedOperatorHandle<Signature> op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

std::tuple<Tensor, Tensor> call_rms_norm_backward(const Tensor& grad, const Tensor& grad_sum, const Tensor& x,
                                                  const Tensor& weight, const Tensor& inverse, bool input_grad,
                                                  bool weight_grad) {
  static const auto handle =
      op<std::tuple<Tensor, Tensor>(const Tensor&, const c10::optional<Tensor>&, const Tensor&, const Tensor&,
                                    const Tensor&, bool, bool)>("qwen::rms_norm_backward");
  return handle.call(grad, grad_sum.defined() ? c10::optional<Tensor>(grad_sum) : c10::nullopt, x, weight, inverse,
                     input_grad, weight_grad);
}

// --- the autograd nodes -------------------------------------------------------------------------------------------

// Gradients of rms_norm_trained (edges: x, weight) or add_rms_norm_trained (edges: x, residual, weight; the node's
// outputs: normed, sum).
struct RmsNormBackward : torch::autograd::Node {
  SavedVariable input, weight;  // the norm's input (x, or the sum, an output of this node)
  Tensor inverse;               // [..., 1] float32, no gradient
  bool residual = false;
  at::ScalarType x_dtype = at::kFloat, residual_dtype = at::kFloat;

  std::string name() const override { return residual ? "qwen::AddRmsNormBackward" : "qwen::RmsNormBackward"; }
  void release_variables() override {
    input.reset_data();
    weight.reset_data();
    inverse.reset();
  }
  variable_list apply(variable_list&& grads) override {
    const std::size_t weight_index = residual ? 2 : 1;
    variable_list out(weight_index + 1);
    const Tensor& grad_normed = grads[0];
    const Tensor grad_sum = residual ? grads[1] : Tensor();
    const bool input_grad = should_compute_output(0) || (residual && should_compute_output(1));
    Tensor grad_input, grad_weight;
    if (grad_normed.defined()) {
      std::tie(grad_input, grad_weight) =
          call_rms_norm_backward(grad_normed, grad_sum, input.unpack(dapo::detail::owning_pointer(this)),
                                 weight.unpack(), inverse, input_grad, should_compute_output(weight_index));
    } else {
      grad_input = grad_sum;
    }
    if (!grad_input.defined()) return out;
    if (should_compute_output(0)) out[0] = grad_input.scalar_type() == x_dtype ? grad_input : grad_input.to(x_dtype);
    if (residual && should_compute_output(1)) {
      out[1] = grad_input.scalar_type() == residual_dtype ? grad_input : grad_input.to(residual_dtype);
    }
    out[weight_index] = grad_weight;
    return out;
  }
};

struct SiluAndMulBackward : torch::autograd::Node {
  SavedVariable gate_up;
  std::string name() const override { return "qwen::SiluAndMulBackward"; }
  void release_variables() override { gate_up.reset_data(); }
  variable_list apply(variable_list&& grads) override {
    if (!grads[0].defined() || !should_compute_output(0)) return {Tensor()};
    static const auto handle = op<Tensor(const Tensor&, const Tensor&)>("qwen::silu_and_mul_backward");
    return {handle.call(grads[0], gate_up.unpack())};
  }
};

// Gradients of rotary_qkv (one output) or rotary_qkv_heads (three: q, k, v); edge: the product.
struct RotaryQkvBackward : torch::autograd::Node {
  Tensor cos, signed_sin;  // no gradient
  int64_t heads = 0, kv_heads = 0;
  bool heads_first = false;
  std::vector<int64_t> product_shape;
  std::string name() const override { return "qwen::RotaryQkvBackward"; }
  void release_variables() override {
    cos.reset();
    signed_sin.reset();
  }
  variable_list apply(variable_list&& grads) override {
    bool any = false;
    for (const Tensor& grad : grads) any = any || grad.defined();
    if (!any || !should_compute_output(0)) return {Tensor()};
    if (!heads_first) {
      static const auto handle =
          op<Tensor(const Tensor&, const Tensor&, const Tensor&, int64_t, int64_t, at::IntArrayRef)>(
              "qwen::rotary_qkv_backward");
      return {handle.call(grads[0], cos, signed_sin, heads, kv_heads, product_shape)};
    }
    using Grad = const c10::optional<Tensor>&;
    static const auto handle =
        op<Tensor(Grad, Grad, Grad, const Tensor&, const Tensor&, int64_t, int64_t, at::IntArrayRef)>(
            "qwen::rotary_qkv_heads_backward");
    const auto given = [&](std::size_t i) {
      return grads[i].defined() ? c10::optional<Tensor>(grads[i]) : c10::optional<Tensor>();
    };
    return {handle.call(given(0), given(1), given(2), cos, signed_sin, heads, kv_heads, product_shape)};
  }
};

// Gradients of linear_trained (edges: x, weight, bias): two products and the bias's row sum, written out (ATen's
// autograd records four nodes per product: the product's, the weight's transpose, two reshapes).
struct LinearBackward : torch::autograd::Node {
  SavedVariable x, weight;  // as the product read them (the compute dtype)
  std::vector<int64_t> x_shape;
  bool bias = false;
  at::ScalarType bias_dtype = at::kFloat;
  std::string name() const override { return "qwen::LinearBackward"; }
  void release_variables() override {
    x.reset_data();
    weight.reset_data();
  }
  variable_list apply(variable_list&& grads) override {
    variable_list out(3);  // one per edge: x, weight, bias (an undefined bias has an empty edge)
    const Tensor& grad = grads[0];
    if (!grad.defined()) return out;
    const Tensor rows = grad.reshape({-1, grad.size(-1)});  // [rows, out]
    if (should_compute_output(0)) out[0] = at::mm(rows, weight.unpack()).view(x_shape);
    if (should_compute_output(1)) {
      const Tensor input = x.unpack();
      out[1] = at::mm(rows.t(), input.reshape({-1, input.size(-1)}));
    }
    if (bias && should_compute_output(2)) out[2] = at::sum(rows, {0}, false, bias_dtype);
    return out;
  }
};

bool records(std::initializer_list<const Tensor*> inputs) {
  if (!torch::GradMode::is_enabled()) return false;
  for (const Tensor* input : inputs) {
    if (input->defined() && input->requires_grad()) return true;
  }
  return false;
}

std::atomic<bool>& unfused_training() {
  static std::atomic<bool> value{false};
  return value;
}

}  // namespace

bool uses_fused_training(const torch::Tensor& x) {
  return !unfused_training().load() && (x.is_cuda() || active_autocast_dtype(x.device()).has_value());
}

UnfusedTraining::UnfusedTraining() : previous_(unfused_training().exchange(true)) {}

UnfusedTraining::~UnfusedTraining() {
  unfused_training().store(previous_);
}

torch::Tensor rms_norm_trained(const torch::Tensor& x, const torch::Tensor& weight, double eps,
                               torch::ScalarType out_dtype) {
  static const auto handle =
      op<std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, double, at::ScalarType)>("qwen::rms_norm_forward");
  const bool graph = records({&x, &weight});
  Tensor normed, inverse;
  {
    const torch::NoGradGuard no_grad;
    std::tie(normed, inverse) = handle.call(x, weight, eps, out_dtype);
  }
  if (!graph) return normed;
  const auto node = dapo::detail::make_autograd_node<RmsNormBackward>();
  node->set_next_edges(torch::autograd::collect_next_edges(x, weight));
  node->input = SavedVariable(x, /*is_output=*/false);
  node->weight = SavedVariable(weight, /*is_output=*/false);
  node->inverse = inverse;
  node->x_dtype = x.scalar_type();
  torch::autograd::set_history(normed, node);
  return normed;
}

std::pair<torch::Tensor, torch::Tensor> add_rms_norm_trained(const torch::Tensor& x, const torch::Tensor& residual,
                                                             const torch::Tensor& weight, double eps,
                                                             torch::ScalarType out_dtype) {
  static const auto handle =
      op<std::tuple<Tensor, Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, double, at::ScalarType)>(
          "qwen::add_rms_norm_forward");
  const bool graph = records({&x, &residual, &weight});
  Tensor normed, sum, inverse;
  {
    const torch::NoGradGuard no_grad;
    std::tie(normed, sum, inverse) = handle.call(x, residual, weight, eps, out_dtype);
  }
  if (!graph) return {std::move(normed), std::move(sum)};
  const auto node = dapo::detail::make_autograd_node<RmsNormBackward>();
  node->set_next_edges(torch::autograd::collect_next_edges(x, residual, weight));
  node->residual = true;
  node->x_dtype = x.scalar_type();
  node->residual_dtype = residual.scalar_type();
  std::vector<Tensor> outputs{normed, sum};
  torch::autograd::set_history(outputs, node);
  node->input = SavedVariable(outputs[1], /*is_output=*/true);
  node->weight = SavedVariable(weight, /*is_output=*/false);
  node->inverse = inverse;
  return {outputs[0], outputs[1]};
}

torch::Tensor silu_and_mul_trained(const torch::Tensor& gate_up) {
  const bool graph = records({&gate_up});
  Tensor out;
  {
    const torch::NoGradGuard no_grad;
    out = silu_and_mul(gate_up);
  }
  if (!graph) return out;
  const auto node = dapo::detail::make_autograd_node<SiluAndMulBackward>();
  node->set_next_edges(torch::autograd::collect_next_edges(gate_up));
  node->gate_up = SavedVariable(gate_up, /*is_output=*/false);
  torch::autograd::set_history(out, node);
  return out;
}

torch::Tensor linear_trained(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias) {
  // Autocast's casts of the input and the weight made here, differentiable, so that the node saves what the product
  // read (no-ops where they already are in its dtype: the norms' outputs, the step's weight casts); autocast casts
  // the bias inside the product as before.
  const std::optional<torch::ScalarType> dtype = active_autocast_dtype(x.device());
  const Tensor input = dtype && x.scalar_type() != *dtype ? x.to(*dtype) : x;
  const Tensor matrix = dtype && weight.scalar_type() != *dtype ? weight.to(*dtype) : weight;
  Tensor out;
  {
    const torch::NoGradGuard no_grad;
    out = at::linear(input, matrix, bias);
  }
  if (!records({&input, &matrix, &bias})) return out;
  const auto node = dapo::detail::make_autograd_node<LinearBackward>();
  node->set_next_edges(torch::autograd::collect_next_edges(input, matrix, bias));
  node->x = SavedVariable(input, /*is_output=*/false);
  node->weight = SavedVariable(matrix, /*is_output=*/false);
  node->x_shape = input.sizes().vec();
  node->bias = bias.defined();
  if (node->bias) node->bias_dtype = bias.scalar_type();
  torch::autograd::set_history(out, node);
  return out;
}

torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias) {
  if (torch::GradMode::is_enabled() && uses_fused_training(x)) return linear_trained(x, weight, bias);
  return at::linear(x, weight, bias);
}

namespace {

// The product's autograd node for rotary_qkv's outputs, where the product asks for gradients.
void rotary_history(std::vector<Tensor>& outputs, const Tensor& product, const Tensor& cos, const Tensor& signed_sin,
                    int64_t heads, int64_t kv_heads, bool heads_first) {
  if (!records({&product})) return;
  const auto node = dapo::detail::make_autograd_node<RotaryQkvBackward>();
  node->set_next_edges(torch::autograd::collect_next_edges(product));
  node->cos = cos;
  node->signed_sin = signed_sin;
  node->heads = heads;
  node->kv_heads = kv_heads;
  node->heads_first = heads_first;
  node->product_shape = product.sizes().vec();
  torch::autograd::set_history(outputs, node);
}

}  // namespace

torch::Tensor rotary_qkv(const torch::Tensor& product, const torch::Tensor& cos, const torch::Tensor& signed_sin,
                         int64_t heads, int64_t kv_heads) {
  static const auto handle =
      op<Tensor(const Tensor&, const Tensor&, const Tensor&, int64_t, int64_t)>("qwen::rotary_qkv");
  std::vector<Tensor> outputs(1);
  {
    const torch::NoGradGuard no_grad;
    outputs[0] = handle.call(product, cos, signed_sin, heads, kv_heads);
  }
  rotary_history(outputs, product, cos, signed_sin, heads, kv_heads, false);
  return outputs[0];
}

std::vector<torch::Tensor> rotary_qkv_heads(const torch::Tensor& product, const torch::Tensor& cos,
                                            const torch::Tensor& signed_sin, int64_t heads, int64_t kv_heads) {
  static const auto handle =
      op<std::tuple<Tensor, Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, int64_t, int64_t)>(
          "qwen::rotary_qkv_heads");
  std::vector<Tensor> outputs(3);
  {
    const torch::NoGradGuard no_grad;
    std::tie(outputs[0], outputs[1], outputs[2]) = handle.call(product, cos, signed_sin, heads, kv_heads);
  }
  rotary_history(outputs, product, cos, signed_sin, heads, kv_heads, true);
  return outputs;
}

}  // namespace qwen::fused
