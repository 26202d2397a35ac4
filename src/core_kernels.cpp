// dapo_core_compiled: the core's policy-loss kernels (dapo::core::policy_loss for float and double), compiled once
// for the programs that define DAPO_SEPARATE_COMPILATION (<dapo/core/kernel_abi.hpp>). The headers stay the library;
// this file only chooses where their code is compiled.
#define DAPO_COMPILE_CORE_KERNELS
#include <dapo/core/loss.hpp>
