// dapo_torch_compiled: the tensor front end's CPU policy-loss kernel and the core's, compiled once for the programs
// that define DAPO_SEPARATE_COMPILATION (<dapo/core/kernel_abi.hpp>). The headers stay the library; this file only
// chooses where their code is compiled.
#define DAPO_COMPILE_TORCH_KERNELS
#include <dapo/loss.hpp>
