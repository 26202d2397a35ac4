// qwen::Tokenizer encoding throughput on GSM8K train text (every question and answer), one thread, best of 3.
// Checks first that encode -> decode gives back every text; needs no LibTorch.
// Usage: tokenizer_bench --tokenizer DIR --data train.jsonl [--json PATH]
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "qwen_gsm8k/text/tokenizer.hpp"
#include "support/flags.hpp"

namespace {

struct Options {
  std::string tokenizer_dir, data_path, json_path;
};

// Throws std::invalid_argument naming a bad flag; nullopt when --help printed the flags.
std::optional<Options> parse_options(int argc, char** argv) {
  Options options;
  dapo::bench::Flags flags("tokenizer_bench");
  flags.text("--tokenizer", options.tokenizer_dir, "DIR", "the folder of tokenizer.json (required)")
      .text("--data", options.data_path, "FILE", "GSM8K's train.jsonl (required)")
      .text("--json", options.json_path, "PATH", "where the JSON record goes (none if not given)");
  if (!flags.parse(argc, argv)) return std::nullopt;
  if (options.tokenizer_dir.empty() || options.data_path.empty()) {
    throw std::invalid_argument("usage: tokenizer_bench --tokenizer DIR --data train.jsonl [--json PATH]");
  }
  return options;
}

// The "question" and "answer" of each JSON line.
std::vector<std::string> read_texts(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path + " (hint: pass GSM8K's train.jsonl)");
  std::vector<std::string> texts;
  std::string line;
  for (std::size_t line_number = 1; std::getline(in, line); ++line_number) {
    if (line.empty()) continue;
    try {
      const auto record = nlohmann::json::parse(line);
      texts.push_back(record.at("question").get<std::string>());
      texts.push_back(record.at("answer").get<std::string>());
    } catch (const nlohmann::json::exception& error) {
      throw std::runtime_error(path + ":" + std::to_string(line_number) + ": " + error.what() +
                               " (hint: each line must be {\"question\": ..., \"answer\": ...})");
    }
  }
  return texts;
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown CPU";
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) try {
  const std::optional<Options> parsed = parse_options(argc, argv);
  if (!parsed) return 0;  // --help
  const Options& options = *parsed;

  const auto load_start = std::chrono::steady_clock::now();
  const auto tokenizer = qwen::Tokenizer::from_directory(options.tokenizer_dir);
  const double load_seconds = seconds_since(load_start);
  const std::vector<std::string> texts = read_texts(options.data_path);
  std::size_t bytes = 0;
  for (const auto& text : texts) bytes += text.size();

  // Check first: a fast tokenizer that loses text is not a result. (GSM8K is NFC already, so no text changes.)
  std::size_t tokens = 0;
  for (std::size_t i = 0; i < texts.size(); ++i) {
    const auto ids = tokenizer.encode(texts[i]);
    tokens += ids.size();
    if (tokenizer.decode(ids) != texts[i]) {
      std::fprintf(stderr, "round trip failed for text %zu of %s:\n%s\n", i, options.data_path.c_str(),
                   texts[i].c_str());
      return 1;
    }
  }

  // The checking pass has filled the piece cache, as a long training run would: the best-of-3 passes measure that
  // steady state. A fresh load (its own empty cache) gives the cold-cache figure.
  const auto cold_tokenizer = qwen::Tokenizer::from_directory(options.tokenizer_dir);
  const auto cold_start = std::chrono::steady_clock::now();
  for (const auto& text : texts) (void)cold_tokenizer.encode(text);
  const double cold_seconds = seconds_since(cold_start);

  double best_seconds = 1e300;
  for (int repeat = 0; repeat < 3; ++repeat) {
    const auto start = std::chrono::steady_clock::now();
    std::size_t count = 0;
    for (const auto& text : texts) count += tokenizer.encode(text).size();
    best_seconds = std::min(best_seconds, seconds_since(start));
    if (count != tokens) throw std::runtime_error("encoding is not deterministic across passes");
  }

  const double megabytes = static_cast<double>(bytes) / 1e6;
  std::printf("qwen::Tokenizer::encode, GSM8K train (%zu texts, %.2f MB, %zu tokens), 1 thread, %s\n", texts.size(),
              megabytes, tokens, cpu_model().c_str());
  std::printf("%-28s %10.3f s\n", "load tokenizer.json", load_seconds);
  std::printf("%-28s %10.3f s %10.2f MB/s %12.0f tokens/s\n", "encode, cold cache", cold_seconds,
              megabytes / cold_seconds, static_cast<double>(tokens) / cold_seconds);
  std::printf("%-28s %10.3f s %10.2f MB/s %12.0f tokens/s\n", "encode, warm cache (best/3)", best_seconds,
              megabytes / best_seconds, static_cast<double>(tokens) / best_seconds);

  if (!options.json_path.empty()) {
    const nlohmann::json record{
        {"benchmark", "qwen::Tokenizer::encode on GSM8K train questions and answers, 1 thread"},
        {"machine", {{"cpu", cpu_model()}, {"hardware_threads", std::thread::hardware_concurrency()}}},
        {"texts", texts.size()},
        {"bytes", bytes},
        {"tokens", tokens},
        {"load_seconds", load_seconds},
        {"cold_seconds", cold_seconds},
        {"cold_mb_per_s", megabytes / cold_seconds},
        {"best_seconds", best_seconds},
        {"mb_per_s", megabytes / best_seconds},
        {"tokens_per_s", static_cast<double>(tokens) / best_seconds}};
    std::ofstream out(options.json_path);
    if (!out) throw std::runtime_error("cannot write " + options.json_path);
    out << record.dump(2) << "\n";
  }
  return 0;
} catch (const std::exception& error) {
  std::fprintf(stderr, "tokenizer_bench: %s\n", error.what());
  return 2;
}
