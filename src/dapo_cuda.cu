// The dapo::cuda target: registers the CUDA kernels with dapo::policy_loss and dapo::linear_logprobs (see the header).
// Built only when LibTorch has CUDA; everything else in dapo is header-only.
#include <dapo/cuda/register.cuh>
