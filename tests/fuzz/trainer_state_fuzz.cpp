// Fuzz target: a checkpoint's trainer_state.json as --resume reads it: the counters, the options and the data
// sampler's state. An accepted state gives a sampler that draws valid indices.
#include "fuzz_support.hpp"
#include "qwen_gsm8k/data/data.hpp"
#include "qwen_gsm8k/train/trainer_state_file.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const std::string source = "trainer_state.json";
  dapo::fuzz::expect_clean_rejection(source, [&] {
    const qwen::TrainerStateFile state = qwen::parse_trainer_state(dapo::fuzz::as_text(data, size), source);
    if (state.step < 0 || state.updates < 0) dapo::fuzz::finding("accepted negative counters");
    if (qwen::parse_trainer_state(qwen::to_json(state).dump(), source).step != state.step) {
      dapo::fuzz::finding("trainer_state.json does not survive to_json and back");
    }
    try {
      qwen::ProblemSampler sampler = qwen::ProblemSampler::from_state(state.sampler);
      for (const std::size_t index : sampler.next(std::min<std::size_t>(sampler.count() + 3, 64))) {
        if (index >= sampler.count()) dapo::fuzz::finding("the sampler drew an index outside its data");
      }
    } catch (const std::invalid_argument&) {
      // A sampler state that from_state refuses, naming the field (--resume adds the file; see trainer_state.cpp).
    }
  });
  return 0;
}
