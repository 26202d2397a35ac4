// generate(): the generation engine in one call for a list of prompts, with the reference decoder's options and
// output (model/generation.hpp): every prompt is a request of one sample, all in slots at once, each drawing from its
// own stream (prompt b's seed mixed from the options' seed and b), so a prompt's tokens do not depend on the others'.
//
// Shapes: B = prompts, N = max_new_tokens.
#pragma once

#include <cstdint>
#include <vector>

#include "qwen_gsm8k/engine/engine.hpp"
#include "qwen_gsm8k/model/generation.hpp"

namespace qwen {

// The engine's options for generating as `options` say (length, stop ids, sampling, log-probs) with `max_num_seqs`
// slots; the rest the engine's defaults.
EngineOptions engine_options(const GenerationOptions& options, int64_t max_num_seqs);

// Throws std::invalid_argument as check_generation says. `stats`: the engine's counts of the run.
GenerationOutput generate(Qwen2ForCausalLM& model, const std::vector<std::vector<int64_t>>& prompts,
                          const GenerationOptions& options, EngineStats* stats = nullptr);

}  // namespace qwen
