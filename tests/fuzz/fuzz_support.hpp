// What the fuzz targets share: a scratch directory for parsers that read files, the tokenizer that text targets
// encode with, and the rule every target enforces: bad input may only throw the exceptions our APIs document
// (std::runtime_error, std::invalid_argument) with a message naming the input; anything else (a crash, a sanitizer
// report, an exception of another type such as nlohmann::json's own, which names no file) is a finding.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>

#include "qwen_gsm8k/text/tokenizer.hpp"

namespace dapo::fuzz {

inline std::string_view as_text(const uint8_t* data, std::size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// A directory of this process's own under $TMPDIR (removed at exit), for targets whose parser reads a file.
inline const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path dir = [] {
    const auto path = std::filesystem::temp_directory_path() / ("dapo-fuzz-" + std::to_string(::getpid()));
    std::filesystem::create_directories(path);
    std::atexit([] {
      std::filesystem::remove_all(std::filesystem::temp_directory_path() / ("dapo-fuzz-" + std::to_string(::getpid())));
    });
    return path;
  }();
  return dir;
}

inline std::filesystem::path write_scratch(const std::string& name, std::string_view bytes) {
  const auto path = scratch_dir() / name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out.flush()) std::abort();  // the harness itself failed, not the code under test
  return path;
}

// A finding: prints why and aborts, which libFuzzer reports with the input that caused it.
[[noreturn]] inline void finding(const std::string& what) {
  std::fprintf(stderr, "FINDING: %s\n", what.c_str());
  std::abort();
}

// Runs `parse`; a documented rejection must name `source` in its message.
template <typename Parse>
void expect_clean_rejection(const std::string& source, Parse&& parse) {
  try {
    parse();
  } catch (const std::invalid_argument& error) {
    if (std::string_view(error.what()).find(source) == std::string_view::npos) {
      finding("invalid_argument without \"" + source + "\": " + error.what());
    }
  } catch (const std::runtime_error& error) {
    if (std::string_view(error.what()).find(source) == std::string_view::npos) {
      finding("runtime_error without \"" + source + "\": " + error.what());
    }
  }
}

// The tokenizer text targets use: Qwen2.5's (DAPO_SHARED_DIR or ../shared beside the working directory, as the tests
// find it) when present, else a byte-level one with Qwen's special tokens, so the target still runs without the data.
inline const qwen::Tokenizer& fuzz_tokenizer() {
  static const qwen::Tokenizer tokenizer = [] {
    const char* shared = std::getenv("DAPO_SHARED_DIR");
    const std::filesystem::path dir =
        std::filesystem::path(shared != nullptr ? shared : "../shared") / "fixtures" / "tokenizer" / "qwen2.5";
    if (std::filesystem::exists(dir / "tokenizer.json")) {
      std::fprintf(stderr, "fuzz: the Qwen2.5 tokenizer from %s\n", dir.c_str());
      return qwen::Tokenizer::from_directory(dir);
    }
    std::fprintf(stderr, "fuzz: %s not found (set DAPO_SHARED_DIR); a byte-level tokenizer instead\n", dir.c_str());
    return qwen::Tokenizer::byte_level({"<|endoftext|>", "<|im_start|>", "<|im_end|>"});
  }();
  return tokenizer;
}

}  // namespace dapo::fuzz
