// The core algorithms on Eigen arrays, for codebases without LibTorch. Thin adapters over <dapo/core/...>: they check
// that the storage is contiguous and row-major (what the core's [B, T] buffers are) and allocate only what they return.
//
// Shapes: N = num_groups * group_size; B = responses, T = response tokens.
#pragma once

#include <Eigen/Core>

#include <cstdint>
#include <span>
#include <type_traits>

#include "dapo/core/advantage.hpp"
#include "dapo/core/error.hpp"
#include "dapo/core/loss.hpp"
#include "dapo/core/sampling.hpp"

namespace dapo::eigen {

template <class Scalar>
using RowMajorArray = Eigen::Array<Scalar, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class Scalar>
using Vector = Eigen::Array<Scalar, Eigen::Dynamic, 1>;

namespace detail {

// A read-only span over an Eigen expression stored contiguously in row-major order.
template <class Derived>
std::span<const typename Derived::Scalar> contiguous(const Eigen::DenseBase<Derived>& array, const char* name,
                                                     const char* where) {
  const auto& plain = array.derived();
  const bool row_major_contiguous =
      plain.innerStride() == 1 && (plain.rows() <= 1 || plain.outerStride() == plain.cols());
  const bool vector_contiguous = (plain.cols() == 1 || plain.rows() == 1) && plain.innerStride() == 1;
  DAPO_REQUIRE((Derived::IsRowMajor && row_major_contiguous) || vector_contiguous, where, name,
               " is not a contiguous row-major array; copy it into dapo::eigen::RowMajorArray first");
  return {plain.data(), static_cast<std::size_t>(plain.size())};
}

}  // namespace detail

// rewards [N] -> advantages [N].
template <class Derived>
Vector<typename Derived::Scalar> group_advantages(const Eigen::DenseBase<Derived>& rewards, int64_t group_size,
                                                  const AdvantageOptions& options = {}) {
  const auto input = detail::contiguous(rewards, "rewards", "dapo::eigen::group_advantages");
  Vector<typename Derived::Scalar> advantages(rewards.size());
  core::group_advantages(input, group_size, std::span(advantages.data(), input.size()), options);
  return advantages;
}

// logp, old_logp, mask [B, T] row-major; advantages [B] or [B, T]; grad_logp, when given, is resized to [B, T].
template <class Scalar, class AdvantagesDerived>
core::PolicyLossResult policy_loss(const RowMajorArray<Scalar>& logp, const RowMajorArray<Scalar>& old_logp,
                                   const Eigen::DenseBase<AdvantagesDerived>& advantages,
                                   const RowMajorArray<Scalar>& mask, const PolicyLossOptions& options = {},
                                   RowMajorArray<Scalar>* grad_logp = nullptr) {
  constexpr const char* kWhere = "dapo::eigen::policy_loss";
  DAPO_REQUIRE(old_logp.rows() == logp.rows() && old_logp.cols() == logp.cols(), kWhere, "old_logp has shape [",
               old_logp.rows(), ", ", old_logp.cols(), "] but logp has [", logp.rows(), ", ", logp.cols(), "]");
  DAPO_REQUIRE(mask.rows() == logp.rows() && mask.cols() == logp.cols(), kWhere, "mask has shape [", mask.rows(), ", ",
               mask.cols(), "] but logp has [", logp.rows(), ", ", logp.cols(), "]");
  std::span<Scalar> grad;
  if (grad_logp != nullptr) {
    grad_logp->resize(logp.rows(), logp.cols());
    grad = std::span(grad_logp->data(), static_cast<std::size_t>(grad_logp->size()));
  }
  static_assert(std::is_same_v<typename AdvantagesDerived::Scalar, Scalar>, "advantages must have logp's scalar type");
  return core::policy_loss<Scalar>(detail::contiguous(logp, "logp", kWhere),
                                   detail::contiguous(old_logp, "old_logp", kWhere),
                                   detail::contiguous(advantages, "advantages", kWhere),
                                   detail::contiguous(mask, "mask", kWhere), logp.rows(), logp.cols(), options, grad);
}

}  // namespace dapo::eigen
