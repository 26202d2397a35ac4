// block_cast: a block of parameters read in a product's dtype, whose backward adds into the parameters' gradients.
#include "qwen_gsm8k/model/block_cast.hpp"

#include <doctest/doctest.h>
#include <torch/torch.h>

#include <vector>

namespace {

using torch::Tensor;

// Three parameters of 2, 3 and 1 rows laid side by side in one block, as FusedLinears lays them out.
struct Block {
  Tensor block;
  std::vector<Tensor> parts;
  explicit Block(int64_t columns) {
    torch::manual_seed(3);
    const torch::NoGradGuard no_grad;
    block = torch::randn({6, columns});
    int64_t offset = 0;
    for (const int64_t rows : {2, 3, 1}) {
      Tensor part = torch::zeros({rows, columns}).requires_grad_(true);
      part.set_data(block.narrow(0, offset, rows));
      parts.push_back(part);
      offset += rows;
    }
  }
};

// What autograd's own calls give: the parts joined and cast, then split back, each part's gradient accumulated.
struct Reference {
  std::vector<Tensor> parts;
  explicit Reference(const Block& from) {
    for (const Tensor& part : from.parts) parts.push_back(part.detach().clone().requires_grad_(true));
  }
  Tensor cast(torch::ScalarType dtype) const { return torch::cat(parts, 0).to(dtype); }
};

// A function of the block with a gradient that differs per element.
Tensor use(const Tensor& cast, const Tensor& x) {
  return (torch::matmul(x.to(cast.scalar_type()), cast.t()).to(torch::kFloat32).pow(2)).sum();
}

}  // namespace

TEST_CASE("block_cast: two backwards add into the parts' gradients, which become slices of one block") {
  for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    CAPTURE(dtype);
    Block block(4);
    const Reference reference(block);
    for (int micro = 0; micro < 2; ++micro) {
      const Tensor x = torch::randn({5, 4});
      use(qwen::block_cast(block.parts, block.block, dtype), x).backward();
      use(reference.cast(dtype), x).backward();
    }
    const auto* base = static_cast<const char*>(block.parts[0].grad().data_ptr());
    int64_t bytes = 0;
    for (std::size_t i = 0; i < block.parts.size(); ++i) {
      CAPTURE(i);
      CHECK(torch::equal(block.parts[i].grad(), reference.parts[i].grad()));
      CHECK(static_cast<const char*>(block.parts[i].grad().data_ptr()) == base + bytes);  // side by side
      CHECK_FALSE(block.parts[i].grad().is_view());  // LibTorch 1.13's zero_grad detaches gradients in place
      bytes += static_cast<int64_t>(block.parts[i].grad().nbytes());
    }
    // Gradients zeroed in place (LibTorch 1.13's zero_grad) stay the block: the next backward adds to them there.
    for (Tensor& part : block.parts) part.mutable_grad().detach_().zero_();
    for (const Tensor& part : reference.parts) part.mutable_grad().zero_();
    const Tensor x = torch::randn({5, 4});
    use(qwen::block_cast(block.parts, block.block, dtype), x).backward();
    use(reference.cast(dtype), x).backward();
    for (std::size_t i = 0; i < block.parts.size(); ++i)
      CHECK(torch::equal(block.parts[i].grad(), reference.parts[i].grad()));
    CHECK(block.parts[0].grad().data_ptr() == static_cast<const void*>(base));
  }
}

TEST_CASE("block_cast: one weight, a gradient set by another path, a frozen part, and autograd::grad") {
  const Tensor x = torch::randn({5, 4});
  SUBCASE("one weight: its gradient is the cast copy, then one add") {
    const Tensor weight = torch::randn({3, 4}).requires_grad_(true);
    const Tensor twin = weight.detach().clone().requires_grad_(true);
    for (int micro = 0; micro < 2; ++micro) {
      use(qwen::block_cast({weight}, weight, torch::kBFloat16), x).backward();
      use(twin.to(torch::kBFloat16), x).backward();
    }
    CHECK(torch::equal(weight.grad(), twin.grad()));
  }
  SUBCASE("a gradient that lies elsewhere is added to where it is") {
    Block block(4);
    const Reference reference(block);
    block.parts[1].mutable_grad() = torch::ones({3, 4});
    reference.parts[1].mutable_grad() = torch::ones({3, 4});
    use(qwen::block_cast(block.parts, block.block, torch::kBFloat16), x).backward();
    use(reference.cast(torch::kBFloat16), x).backward();
    for (std::size_t i = 0; i < block.parts.size(); ++i)
      CHECK(torch::equal(block.parts[i].grad(), reference.parts[i].grad()));
  }
  SUBCASE("a frozen part gets no gradient, the others theirs") {
    Block block(4);
    const Reference reference(block);
    block.parts[0].requires_grad_(false);
    reference.parts[0].requires_grad_(false);
    use(qwen::block_cast(block.parts, block.block, torch::kBFloat16), x).backward();
    use(reference.cast(torch::kBFloat16), x).backward();
    CHECK_FALSE(block.parts[0].grad().defined());
    for (std::size_t i = 1; i < block.parts.size(); ++i)
      CHECK(torch::equal(block.parts[i].grad(), reference.parts[i].grad()));
  }
  SUBCASE("autograd::grad hands each part its rows and leaves .grad alone") {
    Block block(4);
    const Reference reference(block);
    const auto grads =
        torch::autograd::grad({use(qwen::block_cast(block.parts, block.block, torch::kBFloat16), x)}, block.parts);
    const auto expected = torch::autograd::grad({use(reference.cast(torch::kBFloat16), x)}, reference.parts);
    for (std::size_t i = 0; i < block.parts.size(); ++i) {
      CHECK(torch::equal(grads[i], expected[i]));
      CHECK_FALSE(block.parts[i].grad().defined());
    }
  }
  SUBCASE("without gradients: a plain cast, or the block's memory as a new tensor in its own dtype") {
    Block block(4);
    const torch::NoGradGuard no_grad;
    const Tensor same = qwen::block_cast(block.parts, block.block, torch::kFloat32);
    CHECK(same.data_ptr() == block.block.data_ptr());
    CHECK_FALSE(same.requires_grad());
    CHECK(torch::equal(qwen::block_cast(block.parts, block.block, torch::kBFloat16), block.block.to(torch::kBFloat16)));
  }
}
