// Seeds derived from seeds: the splitmix64 constants in one place, so that every draw of a run depends on the run's
// seed and its place in the run only (a resumed run repeats an uninterrupted one). Not a random number generator.
#pragma once

#include <cstdint>

namespace qwen {

inline constexpr uint64_t kSplitMixIncrement = 0x9E3779B97F4A7C15ull;  // 2^64 / golden ratio
inline constexpr uint64_t kSplitMixMultiplier1 = 0xBF58476D1CE4E5B9ull;
inline constexpr uint64_t kSplitMixMultiplier2 = 0x94D049BB133111EBull;

// splitmix64 (Steele, Lea, Flood 2014): one step of the generator as a mixing function.
inline uint64_t splitmix64(uint64_t x) {
  x += kSplitMixIncrement;
  x = (x ^ (x >> 30)) * kSplitMixMultiplier1;
  x = (x ^ (x >> 27)) * kSplitMixMultiplier2;
  return x ^ (x >> 31);
}

// A seed for each (step, round, purpose) of a training run. The three indices enter through the splitmix constants,
// then one multiply-xorshift round mixes them (the trainer's rollouts, evaluation draws and data order use it).
inline uint64_t derived_seed(uint64_t seed, int64_t step, int64_t round, uint64_t purpose) {
  uint64_t x = seed ^ (kSplitMixIncrement * static_cast<uint64_t>(step + 1)) ^
               (kSplitMixMultiplier1 * static_cast<uint64_t>(round + 1)) ^ (kSplitMixMultiplier2 * (purpose + 1));
  x ^= x >> 31;
  x *= 0xD6E8FEB86659FD93ull;
  return x ^ (x >> 32);
}

}  // namespace qwen
