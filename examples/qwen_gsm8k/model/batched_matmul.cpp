// Batched sgemm with LibTorch 1.13's operand rules (see the header).
#include "qwen_gsm8k/model/batched_matmul.hpp"

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <tuple>
#include <vector>

#include "dapo/detail/autograd_node.hpp"

namespace qwen {
namespace {

// The Fortran BLAS entry point LibTorch calls for float32 products.
using Sgemm = void (*)(const char* transa, const char* transb, const int* m, const int* n, const int* k,
                       const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
                       const float* beta, float* c, const int* ldc);

// nullptr where LibTorch's bmm does not call it matrix by matrix: with MKL (pip's wheels) bmm hands the batch to
// MKL's batched gemm, whose bits a loop of sgemm calls does not give; then batched_matmul is torch::bmm.
Sgemm loaded_sgemm() {
  static const auto sgemm = at::hasMKL() ? nullptr : reinterpret_cast<Sgemm>(::dlsym(RTLD_DEFAULT, "sgemm_"));
  return sgemm;
}

// Where the matrices of a batch are: matrix i at data + offset(i). A plain batch steps by its batch stride; a batch
// of shared key/value heads [B, KV, ...] serves `groups` consecutive query heads of `heads` per row b.
struct Layout {
  int64_t batch_stride = 0, heads = 1, groups = 1, head_stride = 0;
  int64_t offset(int64_t i) const { return (i / heads) * batch_stride + ((i % heads) / groups) * head_stride; }
};

// One BLAS operand: a matrix of the batch as BLAS reads it (column-major), with its transpose flag and leading
// dimension, and where each matrix of the batch starts.
struct Operand {
  const float* data = nullptr;
  int64_t ld = 0;
  bool transposed = false, copied = false;
  Layout layout;
};

// The call for every matrix of the batch: C^T or C = op(first) op(second), as LibTorch's addmm decides it.
struct Plan {
  char transa = 'n', transb = 'n';
  int64_t m = 0, n = 0, k = 0, ldc = 0;
  Operand first, second;
};

// How LibTorch reads one matrix of `batch` as a BLAS operand whose column-major shape is lead x other, when the
// product is (swap) or is not computed as C^T: as it is, as its transpose, or, when neither fits its strides, as a
// contiguous copy (LibTorch clones that matrix; `copy` then holds the copy of the whole batch).
Operand as_operand(const torch::Tensor& batch, const Layout& layout, bool swap, int64_t lead, int64_t other,
                   torch::Tensor& copy) {
  // The strides along BLAS's rows and columns of the matrix (LibTorch indexes them by the swap).
  const int64_t s0 = batch.stride(swap ? 2 : 1), s1 = batch.stride(swap ? 1 : 2);
  Operand operand{batch.data_ptr<float>(), 0, false, false, layout};
  if (s0 == 1 && s1 >= std::max<int64_t>(1, lead)) {
    operand.ld = s1;
  } else if (s1 == 1 && s0 >= std::max<int64_t>(1, other)) {
    operand.transposed = true;
    operand.ld = s0;
  } else {
    copy = batch.contiguous();
    operand = {copy.data_ptr<float>(), copy.size(2), !swap, true, {copy.stride(0)}};
  }
  return operand;
}

// LibTorch 1.13's addmm_impl_cpu_ for result = a[i] b[i] into a contiguous [M, N] result, then cpublas's
// normalize_last_dims; std::nullopt where LibTorch would not call sgemm. a and b are [count, M, K] and [count, K, N]
// views whose matrices have the operands' strides; `copies` keeps the operands made contiguous alive.
std::optional<Plan> plan_products(const torch::Tensor& a, const Layout& a_layout, const torch::Tensor& b,
                                  const Layout& b_layout, torch::Tensor (&copies)[2]) {
  const int64_t rows = a.size(1), inner = a.size(2), cols = b.size(2);
  Plan plan;
  // A row-major result is BLAS's transposed one, unless it has one column (then both layouts agree and LibTorch
  // keeps it as is): C^T = B^T A^T swaps the operands.
  const bool swap = cols != 1;
  plan.m = swap ? cols : rows;
  plan.n = swap ? rows : cols;
  plan.k = inner;
  plan.ldc = swap ? cols : 1;
  plan.first = as_operand(swap ? b : a, swap ? b_layout : a_layout, swap, plan.m, plan.k, copies[0]);
  plan.second = as_operand(swap ? a : b, swap ? a_layout : b_layout, swap, plan.k, plan.n, copies[1]);
  plan.transa = plan.first.transposed ? 't' : 'n';
  plan.transb = plan.second.transposed ? 't' : 'n';
  // cpublas::internal::normalize_last_dims: leading dimensions of degenerate matrices.
  if (plan.n == 1) plan.ldc = plan.m;
  if (plan.first.transposed) {
    if (plan.m == 1) plan.first.ld = plan.k;
  } else if (plan.k == 1) {
    plan.first.ld = plan.m;
  }
  if (plan.second.transposed) {
    if (plan.k == 1) plan.second.ld = plan.n;
  } else if (plan.n == 1) {
    plan.second.ld = plan.k;
  }
  // cpublas's use_blas_gemm: otherwise LibTorch uses its own loops.
  const auto fits = [](int64_t value) { return value <= INT_MAX; };
  if (!(fits(plan.m) && fits(plan.n) && fits(plan.k) && fits(plan.first.ld) && fits(plan.second.ld) && fits(plan.ldc) &&
        plan.first.ld >= std::max<int64_t>(1, plan.first.transposed ? plan.k : plan.m) &&
        plan.second.ld >= std::max<int64_t>(1, plan.second.transposed ? plan.n : plan.k) &&
        plan.ldc >= std::max<int64_t>(1, plan.m))) {
    return std::nullopt;
  }
  return plan;
}

// Whether sgemm gives the same bits for op(A) [m, k] times two columns in one call as in two calls of one column
// (transb 'n'), for this shape: computed once per shape on fixed pseudo-random operands, then remembered.
bool two_columns_exact(Sgemm sgemm, char transa, int m, int k) {
  static std::mutex mutex;
  static std::map<std::tuple<char, int, int>, bool> known;
  const std::lock_guard<std::mutex> lock(mutex);
  const auto [entry, added] = known.try_emplace({transa, m, k}, false);
  if (!added) return entry->second;
  std::mt19937 generator(static_cast<unsigned>(m) * 7919u + static_cast<unsigned>(k));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const auto size = static_cast<std::size_t>(m) * static_cast<std::size_t>(k);
  std::vector<float> a(size), b(2 * static_cast<std::size_t>(k)), separate(2 * static_cast<std::size_t>(m)),
      together(separate.size());
  for (float& value : a) value = normal(generator);
  for (float& value : b) value = normal(generator);
  const char transb = 'n';
  const int lda = transa == 'n' ? m : k, one = 1, two = 2;
  const float alpha = 1.0f, beta = 0.0f;
  sgemm(&transa, &transb, &m, &one, &k, &alpha, a.data(), &lda, b.data(), &k, &beta, separate.data(), &m);
  sgemm(&transa, &transb, &m, &one, &k, &alpha, a.data(), &lda, b.data() + k, &k, &beta, separate.data() + m, &m);
  sgemm(&transa, &transb, &m, &two, &k, &alpha, a.data(), &lda, b.data(), &k, &beta, together.data(), &m);
  entry->second = std::memcmp(separate.data(), together.data(), separate.size() * sizeof(float)) == 0;
  return entry->second;
}

bool cpu_float(const torch::Tensor& tensor) {
  return tensor.device().is_cpu() && tensor.scalar_type() == torch::kFloat32 && !tensor.is_conj() && !tensor.is_neg();
}

// The products a[i] b[layout i], i < a.size(0), as LibTorch's bmm makes them ([count, M, N]), where it would call
// sgemm for each and this process has it; else std::nullopt. With shared heads (b_layout.groups > 1) the operand b may
// not be copied.
std::optional<torch::Tensor> direct_products(const torch::Tensor& a, const torch::Tensor& b, const Layout& b_layout) {
  const Sgemm sgemm = loaded_sgemm();
  if (sgemm == nullptr || !cpu_float(a) || !cpu_float(b) || a.dim() != 3 || b.dim() != 3 || a.size(2) != b.size(1)) {
    return std::nullopt;
  }
  const int64_t count = a.size(0), rows = a.size(1), inner = a.size(2), cols = b.size(2);
  // LibTorch's own loop below 400 multiply-adds per matrix, and its pathological cases.
  if (count == 0 || rows == 0 || cols == 0 || inner == 0 || inner * rows * cols < 400) return std::nullopt;
  torch::Tensor copies[2];
  const std::optional<Plan> plan = plan_products(a, Layout{a.stride(0)}, b, b_layout, copies);
  if (!plan) return std::nullopt;
  const Operand& b_operand = cols != 1 ? plan->first : plan->second;
  if (b_layout.groups > 1 && b_operand.copied) return std::nullopt;
  torch::Tensor result = torch::empty({count, rows, cols}, a.options());
  float* out = result.data_ptr<float>();
  const Plan p = *plan;
  const int m = static_cast<int>(p.m), k = static_cast<int>(p.k);
  const int lda = static_cast<int>(p.first.ld), ldc = static_cast<int>(p.ldc);
  const float alpha = 1.0f, beta = 0.0f;
  const int64_t work = rows * cols * inner;
  // A decode step's products (one query row per matrix) over shared heads: two query heads of a key/value head are
  // one sgemm with two columns instead of two calls with one (their query rows, and their results, lie at a constant
  // stride). Each column is the same dot products; whether the kernels OpenBLAS picks for the shape give the same
  // bits is probed once per shape (two_columns_exact), as the tests check for every cache length up to 256. Not four
  // columns: OpenBLAS's Haswell kernels round some of those differently. Kept to products too small for OpenBLAS's
  // threads, which could split two columns differently.
  const bool merge = b_layout.groups % 2 == 0 && rows == 1 && cols != 1 && p.n == 1 && !p.second.transposed &&
                     !p.second.copied && a.stride(0) >= p.k && a.stride(0) <= INT_MAX && work * 2 < (1 << 18) &&
                     two_columns_exact(sgemm, p.transa, m, k);
  const int64_t step = merge ? 2 : 1;  // matrices per call: a pair starts at an even head, both in one group
  const int n = merge ? 2 : static_cast<int>(p.n);
  const int ldb = merge ? static_cast<int>(a.stride(0)) : static_cast<int>(p.second.ld);
  const int ldc_call = merge ? static_cast<int>(cols) : ldc;
  // Small products in parallel over the batch; large ones (where OpenBLAS uses its own threads) one at a time.
  const int64_t calls = count / step;
  const int64_t grain = work >= (1 << 18) ? calls : std::max<int64_t>(1, (1 << 15) / (work * step));
  at::parallel_for(0, calls, grain, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      const int64_t i = c * step;
      sgemm(&p.transa, &p.transb, &m, &n, &k, &alpha, p.first.data + p.first.layout.offset(i), &lda,
            p.second.data + p.second.layout.offset(i), &ldb, &beta, out + i * rows * cols, &ldc_call);
    }
  });
  return result;
}

torch::Tensor product(const torch::Tensor& a, const torch::Tensor& b) {
  if (b.dim() == 3) {
    if (auto result = direct_products(a, b, Layout{b.stride(0)})) return *result;
  }
  return torch::bmm(a, b);
}

// bmm's autograd as LibTorch's: d a = grad bmm b^T, d b = a^T bmm grad. An autograd Node rather than a
// torch::autograd::Function: g++ 14 reports a false -Warray-bounds inside LibTorch 2.x's Function<T>::apply.
struct BatchedMatmulBackward : torch::autograd::Node {
  torch::autograd::SavedVariable a, b;  // [batch, M, K], [batch, K, N]

  std::string name() const override { return "qwen::BatchedMatmulBackward"; }
  void release_variables() override {
    a.reset_data();
    b.reset_data();
  }
  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    const torch::Tensor& grad = grads[0];
    torch::Tensor grad_a, grad_b;
    if (!grad.defined()) return {grad_a, grad_b};
    if (should_compute_output(0)) grad_a = product(grad, b.unpack().transpose(1, 2));
    if (should_compute_output(1)) grad_b = product(a.unpack().transpose(1, 2), grad);
    return {grad_a, grad_b};
  }
};

torch::Tensor differentiable_product(const torch::Tensor& a, const torch::Tensor& b) {
  torch::Tensor out;
  {
    const torch::NoGradGuard no_grad;  // the product's own copies are not part of the graph
    out = product(a, b);
  }
  const auto node = dapo::detail::make_autograd_node<BatchedMatmulBackward>();
  node->set_next_edges(torch::autograd::collect_next_edges(a, b));
  node->a = torch::autograd::SavedVariable(a, /*is_output=*/false);
  node->b = torch::autograd::SavedVariable(b, /*is_output=*/false);
  torch::autograd::set_history(out, node);
  return out;
}

}  // namespace

torch::Tensor repeat_kv(const torch::Tensor& x, int64_t groups) {
  if (groups == 1) return x;
  const auto sizes = x.sizes();
  return x.unsqueeze(2)
      .expand({sizes[0], sizes[1], groups, sizes[2], sizes[3]})
      .reshape({sizes[0], sizes[1] * groups, sizes[2], sizes[3]});
}

bool direct_batched_matmul_available() {
  return loaded_sgemm() != nullptr;
}

torch::Tensor batched_matmul(const torch::Tensor& a, const torch::Tensor& b) {
  if (!cpu_float(a)) return torch::bmm(a, b);
  if (torch::GradMode::is_enabled() && (a.requires_grad() || b.requires_grad())) {
    return differentiable_product(a, b);
  }
  return product(a, b);
}

torch::Tensor batched_matmul_nd(const torch::Tensor& a, const torch::Tensor& b) {
  TORCH_CHECK(a.dim() >= 3 && a.dim() == b.dim(), "batched_matmul_nd: operands of ", a.dim(), " and ", b.dim(),
              " dimensions, expected the same number, at least 3");
  TORCH_CHECK(a.sizes().slice(0, a.dim() - 2) == b.sizes().slice(0, b.dim() - 2), "batched_matmul_nd: batch shapes ",
              a.sizes(), " and ", b.sizes(), " differ");
  std::vector<int64_t> shape(a.sizes().begin(), a.sizes().end() - 1);
  shape.push_back(b.size(-1));
  const int64_t rows = a.size(-2), inner = a.size(-1), cols = b.size(-1);
  // The reshapes torch::matmul makes (views where the strides allow, copies where not), so the products see the
  // same operands.
  return batched_matmul(a.reshape({-1, rows, inner}), b.reshape({-1, inner, cols})).view(shape);
}

torch::Tensor grouped_matmul(const torch::Tensor& a, const torch::Tensor& shared, bool transpose_shared) {
  TORCH_CHECK(a.dim() == 4 && shared.dim() == 4 && a.size(0) == shared.size(0) && shared.size(1) > 0 &&
                  a.size(1) % shared.size(1) == 0,
              "grouped_matmul: a ", a.sizes(), " and shared heads ", shared.sizes(),
              ", expected [B, N, M, K] and [B, KV, ., .] with KV dividing N");
  const int64_t heads = a.size(1), groups = heads / shared.size(1);
  const auto repeated = [&] {
    const torch::Tensor b = repeat_kv(shared, groups);
    return batched_matmul_nd(a, transpose_shared ? b.transpose(2, 3) : b);
  };
  const bool differentiable = torch::GradMode::is_enabled() && (a.requires_grad() || shared.requires_grad());
  if (groups == 1 || differentiable || !cpu_float(a) || !cpu_float(shared)) return repeated();
  // repeat_kv's copy is contiguous: its matrices have these strides, and so must the ones read in place.
  const bool standard = shared.stride(3) == 1 && shared.stride(2) == shared.size(3);
  const torch::Tensor heads_in_place = standard ? shared : shared.contiguous();
  const torch::Tensor b = transpose_shared ? heads_in_place.transpose(2, 3) : heads_in_place;
  const torch::Tensor a3 = a.reshape({-1, a.size(2), a.size(3)});  // as batched_matmul_nd reshapes it
  const Layout layout{b.stride(0), heads, groups, b.stride(1)};
  if (auto result = direct_products(a3, b.select(1, 0), layout)) {
    return result->view({a.size(0), heads, a.size(2), b.size(3)});
  }
  return repeated();
}

}  // namespace qwen
