// Fuzz target: model.safetensors.index.json, the weight map of a sharded checkpoint. An accepted map names only plain
// file names in the checkpoint's own directory.
#include "fuzz_support.hpp"
#include "qwen_gsm8k/model/safetensors_header.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const std::string source = "model.safetensors.index.json";
  dapo::fuzz::expect_clean_rejection(source, [&] {
    for (const auto& [name, file] : qwen::parse_shard_index(dapo::fuzz::as_text(data, size), source)) {
      if (file.empty() || file == "." || file == ".." || file.find('/') != std::string::npos) {
        dapo::fuzz::finding("accepted shard file name \"" + file + "\" leaves the directory");
      }
    }
  });
  return 0;
}
