// Fuzz target: loading a tokenizer directory. The input is tokenizer.json, and after its first NUL byte (never valid
// in JSON text) tokenizer_config.json. An accepted tokenizer must then encode and decode without failing, with every
// id inside its vocabulary.
#include <algorithm>
#include <vector>

#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const std::string_view input = dapo::fuzz::as_text(data, size);
  const std::size_t nul = input.find('\0');
  const auto dir = dapo::fuzz::scratch_dir() / "tokenizer";
  std::filesystem::create_directories(dir);
  dapo::fuzz::write_scratch("tokenizer/tokenizer.json", input.substr(0, nul));
  if (nul == std::string_view::npos) {
    std::filesystem::remove(dir / "tokenizer_config.json");
  } else {
    dapo::fuzz::write_scratch("tokenizer/tokenizer_config.json", input.substr(nul + 1));
  }
  dapo::fuzz::expect_clean_rejection(dir.string(), [&] {
    const qwen::Tokenizer tokenizer = qwen::Tokenizer::from_directory(dir);
    for (const std::string_view text : {std::string_view("Hello, world! 12,345 <|im_end|>\n\t é"),
                                        std::string_view("\xff\xfe a\xc3", 5), input.substr(0, 64)}) {
      const std::vector<int32_t> ids = tokenizer.encode(text);
      if (std::any_of(ids.begin(), ids.end(), [&](int32_t id) { return id < 0 || id >= tokenizer.vocab_size(); })) {
        dapo::fuzz::finding("encode gave an id outside the vocabulary");
      }
      (void)tokenizer.decode(ids);
      (void)tokenizer.decode(ids, true);
    }
    (void)tokenizer.eos_token_id();
    (void)tokenizer.pad_token_id();
  });
  return 0;
}
