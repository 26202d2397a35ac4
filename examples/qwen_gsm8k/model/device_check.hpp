// Whether a --device can run in this process, checked before any work, with a sentence that says what is missing.
#pragma once

#include <torch/types.h>

#include <string>

namespace qwen {

// Whether this LibTorch was built with CUDA (its CUDA library linked in), whatever the GPUs present.
bool libtorch_has_cuda();

// Throws std::invalid_argument "<command>: --device D ..." where `device` cannot run here: a device type other than
// cpu and cuda; CUDA asked of a LibTorch built without it (a CPU-only build such as Debian's libtorch-dev); CUDA with
// no GPU visible to this process; a GPU index past the last.
void check_device(torch::Device device, const std::string& command);

// --device's text as a device that can run here (check_device), or std::invalid_argument "<command>: --device ...".
torch::Device usable_device(const std::string& text, const std::string& command);

}  // namespace qwen
