// batched_matmul against torch::bmm / torch::matmul: bitwise equal values and gradients, for the operand layouts the
// attention produces (contiguous, transposed views, copies from reshapes, a decode step's single query row) and the
// degenerate ones (one column, one row, products small enough for LibTorch's own loop).
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <string>

#include "qwen_gsm8k/model/batched_matmul.hpp"

namespace {

bool bitwise_equal(const torch::Tensor& a, const torch::Tensor& b) {
  return a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type() && torch::equal(a, b);
}

// a [B, M, K] and b [B, K, N] in the layout `layout` names: plain, a^T stored, b^T stored, both.
std::pair<torch::Tensor, torch::Tensor> operands(int64_t batch, int64_t m, int64_t k, int64_t n, int layout) {
  torch::Tensor a = (layout & 1) ? torch::randn({batch, k, m}).transpose(1, 2) : torch::randn({batch, m, k});
  torch::Tensor b = (layout & 2) ? torch::randn({batch, n, k}).transpose(1, 2) : torch::randn({batch, k, n});
  return {a, b};
}

}  // namespace

TEST_CASE("batched_matmul gives torch::bmm's bits for every operand layout and shape") {
  // Debian's LibTorch has no MKL: its bmm calls sgemm matrix by matrix, and batched_matmul must take the direct path.
  // With MKL (pip's wheels) bmm is MKL's batched gemm and batched_matmul is torch::bmm itself.
  if (at::hasMKL()) {
    MESSAGE("LibTorch with MKL: batched_matmul is torch::bmm (the direct path mirrors bmm without MKL)");
  } else {
    REQUIRE(qwen::direct_batched_matmul_available());
  }
  torch::manual_seed(3);
  const int threads = at::get_num_threads();
  at::set_num_threads(2);  // the batch split over threads, as in the driver
  for (const auto& [batch, m, k, n] :
       std::vector<std::array<int64_t, 4>>{{512, 1, 16, 97},    // a decode step: one query row against the cache
                                           {512, 1, 97, 16},    // its weights times the values
                                           {64, 115, 16, 115},  // a training forward's scores
                                           {64, 115, 115, 16},  // and weighted values
                                           {8, 300, 16, 300},   // large enough for OpenBLAS's own threads
                                           {16, 40, 64, 1},     // one column
                                           {16, 1, 64, 1},      // one row, one column
                                           {32, 3, 5, 7},       // below LibTorch's direct-loop threshold
                                           {3, 17, 1, 33}}) {   // contraction of one
    for (int layout = 0; layout < 4; ++layout) {
      CAPTURE(batch);
      CAPTURE(m);
      CAPTURE(k);
      CAPTURE(n);
      CAPTURE(layout);
      const auto [a, b] = operands(batch, m, k, n, layout);
      CHECK(bitwise_equal(qwen::batched_matmul(a, b), torch::bmm(a, b)));
    }
  }
  // Operands neither contiguous nor transposed (every other matrix row): LibTorch copies them first.
  const torch::Tensor a = torch::randn({8, 60, 32}).narrow(1, 0, 60).slice(2, 0, 32, 2);
  const torch::Tensor b = torch::randn({8, 16, 50}).slice(1, 0, 16);
  CHECK(bitwise_equal(qwen::batched_matmul(a, b), torch::bmm(a, b)));
  at::set_num_threads(threads);
}

TEST_CASE("batched_matmul_nd and its gradients give torch::matmul's bits through the attention's products") {
  torch::manual_seed(4);
  // scores = q k^T with k a transposed view of the cache layout, then weights v, as the eager attention forms them.
  const auto leaf = [](std::vector<int64_t> shape) { return torch::randn(shape).requires_grad_(true); };
  const torch::Tensor q = leaf({4, 3, 20, 16}), k = leaf({4, 3, 20, 16}), v = leaf({4, 3, 20, 16});
  const torch::Tensor upstream = torch::randn({4, 3, 20, 16});
  const auto run = [&](bool ours) {
    const auto product = [&](const torch::Tensor& x, const torch::Tensor& y) {
      return ours ? qwen::batched_matmul_nd(x, y) : torch::matmul(x, y);
    };
    const torch::Tensor scores = product(q * 0.5, k.transpose(2, 3));
    const torch::Tensor out = product(torch::softmax(scores, -1), v);
    const auto grads = torch::autograd::grad({out}, {q, k, v}, {upstream});
    return std::vector<torch::Tensor>{out, grads[0], grads[1], grads[2]};
  };
  const auto ours = run(true), reference = run(false);
  for (std::size_t i = 0; i < ours.size(); ++i) {
    CAPTURE(i);
    CHECK(bitwise_equal(ours[i], reference[i]));
  }
}

TEST_CASE("batched_matmul_nd rejects operands whose batch shapes differ, naming both") {
  const torch::Tensor a = torch::randn({2, 3, 4, 5}), b = torch::randn({2, 4, 5, 6});
  CHECK_THROWS_WITH_AS(qwen::batched_matmul_nd(a, b), doctest::Contains("batch shapes"), c10::Error);
}

TEST_CASE("grouped_matmul reads shared key/value heads in place and gives matmul-with-repeat_kv's bits") {
  torch::manual_seed(5);
  const int threads = at::get_num_threads();
  at::set_num_threads(2);
  // A decode step against a cache: 4 query heads over 2 shared heads, the cache a narrowed [B, KV, max, D] buffer.
  const torch::Tensor cache = torch::randn({6, 2, 80, 16});
  const torch::Tensor keys = cache.narrow(2, 0, 57), query = torch::randn({6, 4, 1, 16});
  const torch::Tensor weights = torch::randn({6, 4, 1, 57}).softmax(-1);
  const torch::Tensor repeated = qwen::repeat_kv(keys, 2);
  CHECK(repeated.sizes() == torch::IntArrayRef({6, 4, 57, 16}));
  CHECK(torch::equal(repeated.select(1, 3), keys.select(1, 1)));
  torch::NoGradGuard no_grad;
  CHECK(bitwise_equal(qwen::grouped_matmul(query, keys, true), torch::matmul(query, repeated.transpose(2, 3))));
  CHECK(bitwise_equal(qwen::grouped_matmul(weights, keys, false), torch::matmul(weights, repeated)));
  // Every cache length a decode step meets here, 1 to 256, with 2 and 4 query heads per shared head: each pair of heads
  // of a group shares one sgemm call (batched_matmul.cpp), and must keep the bits of one call per head.
  for (const int64_t groups : {2, 4}) {
    const torch::Tensor long_cache = torch::randn({3, 2, 256, 16});
    const torch::Tensor query_rows = torch::randn({3, 1, 2 * groups, 16}).transpose(1, 2);  // as q_proj's view gives
    for (int64_t length = 1; length <= 256; ++length) {
      CAPTURE(groups);
      CAPTURE(length);
      const torch::Tensor shared = long_cache.narrow(2, 0, length);
      const torch::Tensor copies = qwen::repeat_kv(shared, groups);
      const torch::Tensor row_weights = torch::randn({3, 2 * groups, 1, length}).softmax(-1);
      const bool scores = bitwise_equal(qwen::grouped_matmul(query_rows, shared, true),
                                        torch::matmul(query_rows, copies.transpose(2, 3)));
      const bool attended =
          bitwise_equal(qwen::grouped_matmul(row_weights, shared, false), torch::matmul(row_weights, copies));
      REQUIRE(scores);
      REQUIRE(attended);
    }
  }
  // A prefill's many query rows; shared heads in a permuted layout (made contiguous first, as repeat_kv's copy is).
  const torch::Tensor permuted = torch::randn({3, 30, 2, 16}).transpose(1, 2);
  const torch::Tensor queries = torch::randn({3, 4, 30, 16});
  CHECK(bitwise_equal(qwen::grouped_matmul(queries, permuted, true),
                      torch::matmul(queries, qwen::repeat_kv(permuted, 2).transpose(2, 3))));
  at::set_num_threads(threads);
  CHECK_THROWS_WITH_AS(qwen::grouped_matmul(queries, torch::randn({3, 3, 30, 16}), true),
                       doctest::Contains("KV dividing N"), c10::Error);
}
