// Compile-only check of the CUDA policy-loss kernel (this machine has nvcc but no GPU): instantiates the launcher for
// the dtype combinations dapo::policy_loss dispatches to. Built when CMake finds a CUDA compiler; never run here.
#include <dapo/cuda/policy_loss.cuh>

template cudaError_t dapo::cuda::launch_policy_loss<float>(const dapo::core::PolicyLossInputs<float, float, bool>&,
                                                           const dapo::PolicyLossOptions&, float*,
                                                           dapo::cuda::UnitSums*, cudaStream_t);
template cudaError_t dapo::cuda::launch_policy_loss<float>(const dapo::core::PolicyLossInputs<float, float, float>&,
                                                           const dapo::PolicyLossOptions&, float*,
                                                           dapo::cuda::UnitSums*, cudaStream_t);
template cudaError_t dapo::cuda::launch_policy_loss<double>(const dapo::core::PolicyLossInputs<double, double, double>&,
                                                            const dapo::PolicyLossOptions&, double*,
                                                            dapo::cuda::UnitSums*, cudaStream_t);
