// Fuzz target: a model's config.json. An accepted config is consistent (validate passes) and survives to_json and
// back unchanged.
#include "fuzz_support.hpp"
#include "qwen_gsm8k/model/config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const auto path = dapo::fuzz::write_scratch("config.json", dapo::fuzz::as_text(data, size));
  dapo::fuzz::expect_clean_rejection(path.string(), [&] {
    const qwen::Config config = qwen::Config::from_file(path);
    const qwen::Config again = qwen::Config::from_json(config.to_json(), "to_json");
    if (again.to_json() != config.to_json()) dapo::fuzz::finding("config.json does not survive to_json and back");
  });
  return 0;
}
