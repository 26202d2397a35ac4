// Each generated sequence's own random numbers: a SplitMix64 stream seeded from its request's seed and its sample
// index, read by token index. A token's draw depends on nothing else: not its slot, the pool's size, its neighbours
// or how many sequences ran before it.
#pragma once

#include <cstdint>

#include "qwen_gsm8k/common/seed.hpp"

namespace qwen {

// The seed of sample `sample` of a request seeded `request_seed`.
inline uint64_t sequence_seed(uint64_t request_seed, int64_t sample) {
  return splitmix64(request_seed ^ (kSplitMixMultiplier1 * static_cast<uint64_t>(sample + 1)));
}

// The uniform in [0, 1) for token `token` of the sequence seeded `seed`: output `token` of SplitMix64 from that seed,
// its top 23 bits, so at most 1 - 2^-23: then u x total < total for any positive float32 total, and the draw
// (fused::sample_tokens) never falls past the last token of positive probability. Exact in float32.
inline float sequence_uniform(uint64_t seed, int64_t token) {
  const uint64_t bits = splitmix64(seed + kSplitMixIncrement * static_cast<uint64_t>(token));
  return static_cast<float>(bits >> 41) * 0x1.0p-23f;
}

}  // namespace qwen
