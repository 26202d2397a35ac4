// Compile-only check of the CUDA kernels (this machine has nvcc but no GPU): instantiates the policy loss's launcher
// for the dtype combinations dapo::policy_loss dispatches to. Built when CMake finds a CUDA compiler; never run here.
#include <dapo/cuda/logprob.cuh>
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

// The lm-head log-prob's kernels (<dapo/cuda/logprob.cuh>) for the plain types; dapo::cuda adds LibTorch's 16-bit ones.
template cudaError_t dapo::cuda::launch_softmax_statistics<float, float>(const float*, int64_t, int64_t, const int64_t*,
                                                                         float*, float*, float*, cudaStream_t);
template cudaError_t dapo::cuda::launch_softmax_statistics<double, double>(const double*, int64_t, int64_t,
                                                                           const int64_t*, double*, double*, double*,
                                                                           cudaStream_t);
template cudaError_t dapo::cuda::launch_logprob_logits_grad<float, float>(float*, int64_t, int64_t, const int64_t*,
                                                                          const float*, const float*, const float*,
                                                                          const float*, cudaStream_t);
template cudaError_t dapo::cuda::launch_logprob_logits_grad<double, double>(double*, int64_t, int64_t, const int64_t*,
                                                                            const double*, const double*, const double*,
                                                                            const double*, cudaStream_t);
