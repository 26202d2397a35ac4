// The two tensor paths of the policy loss, as one function type, for tests that run both on the same cases.
#pragma once

#include <dapo/loss.hpp>
#include <dapo/reference/loss.hpp>

namespace dapo::test {

using LossFn = dapo::PolicyLossOutput (*)(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&,
                                          const torch::Tensor&, const dapo::PolicyLossOptions&);
inline constexpr LossFn kFused = &dapo::policy_loss;
inline constexpr LossFn kReference = &dapo::reference::policy_loss;

}  // namespace dapo::test
