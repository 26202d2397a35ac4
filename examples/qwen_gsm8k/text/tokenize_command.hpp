// `qwen_gsm8k tokenize`: JSON lines in, token-id lines out, for checking this tokenizer against another one.
// Not the CLI itself: main.cpp parses the flags and calls run_tokenize with the process's streams.
#pragma once

#include <filesystem>
#include <iosfwd>

#include "qwen_gsm8k/text/tokenizer.hpp"

namespace qwen {

// Each non-blank input line is either a JSON string, encoded as is, or an object
//   {"messages": [{"role": ..., "content": ...}, ...], "add_generation_prompt": bool (optional, default false)}
// rendered with render_chat and then encoded. Each writes one line, a JSON array of ids such as [9707,11,1879].
// Blank lines are skipped and write nothing.
// Returns 0 on success. On a malformed line it writes "line N: <what is wrong>" to `err` and stops with 1, so that
// every output line still answers the input line at the same position among the non-blank ones. Returns 2 when the
// tokenizer cannot be loaded.
int run_tokenize(const std::filesystem::path& tokenizer_dir, std::istream& in, std::ostream& out, std::ostream& err);
int run_tokenize(const Tokenizer& tokenizer, std::istream& in, std::ostream& out, std::ostream& err);

}  // namespace qwen
