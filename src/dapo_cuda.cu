// The dapo::cuda target: registers the CUDA policy-loss kernel with dapo::policy_loss (see the header). Built only
// when LibTorch has CUDA; everything else in dapo is header-only.
#include <dapo/cuda/register.cuh>
