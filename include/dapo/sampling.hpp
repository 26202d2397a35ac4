// Dynamic sampling (DAPO Section 3.2) on LibTorch tensors: the filter that keeps groups whose responses disagree.
// The collector that draws generation rounds until enough groups are kept is DynamicSampler in
// <dapo/core/sampling.hpp> (it holds whatever the caller's rollouts are, so it needs no tensors).
//
// Shapes: N = num_groups * group_size scores; the G = group_size responses of one prompt are consecutive.
#pragma once

#include <ATen/ATen.h>
#include <torch/types.h>

#include "dapo/core/sampling.hpp"
#include "dapo/detail/tensor_checks.hpp"

namespace dapo {

// scores [N] (floating; pass accuracy, not the shaped reward: see <dapo/core/sampling.hpp>) -> bool [N / group_size],
// true where the group's scores are not all equal, i.e. where group-relative advantages are not all zero.
inline torch::Tensor informative_groups(const torch::Tensor& scores, int64_t group_size) {
  constexpr const char* kWhere = "dapo::informative_groups";
  detail::check_floating(scores, "scores", kWhere);
  detail::check_dim(scores, 1, "scores", kWhere);
  detail::check_group_size(scores.size(0), group_size, kWhere, "scores");
  detail::check_finite(scores, "scores", kWhere);
  torch::NoGradGuard no_grad;
  const torch::Tensor grouped = scores.reshape({-1, group_size});  // [num_groups, G]
  return grouped.amax(1) != grouped.amin(1);
}

}  // namespace dapo
