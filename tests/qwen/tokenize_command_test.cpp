// qwen::run_tokenize: strings and conversations in, id arrays out; blank lines skipped; a malformed line named on
// the error stream with a non-zero status; a tokenizer directory that cannot be loaded.
#include "qwen_gsm8k/text/tokenize_command.hpp"

#include <filesystem>
#include <sstream>
#include <string>

#include "qwen_gsm8k/text/chat.hpp"
#include "support/shared.hpp"

namespace {

struct Run {
  int status;
  std::string out, err;
};

Run run(const qwen::Tokenizer& tokenizer, const std::string& input) {
  std::istringstream in(input);
  std::ostringstream out, err;
  const int status = qwen::run_tokenize(tokenizer, in, out, err);
  return {status, out.str(), err.str()};
}

}  // namespace

TEST_CASE("run_tokenize with the Qwen2.5 tokenizer: strings, conversations, a malformed line") {
  const auto shared = dapo::test::require_shared("fixtures/tokenizer");
  if (!shared) return;
  const auto dir = *shared / "fixtures" / "tokenizer" / "qwen2.5";
  const auto tokenizer = qwen::Tokenizer::from_directory(dir);

  // The ids of "Hello, world" and of the golden conversation without a system message.
  const Run good = run(tokenizer,
                       "\"Hello, world\"\n"
                       "\n"
                       R"({"messages": [{"role": "user", "content": "Hi"}], "add_generation_prompt": true})"
                       "\n");
  CHECK(good.status == 0);
  CHECK(good.err.empty());
  const std::string conversation = qwen::render_chat({{"user", "Hi"}}, true);
  CHECK(good.out == "[9707,11,1879]\n" + nlohmann::json(tokenizer.encode(conversation)).dump() + "\n");

  const Run bad = run(tokenizer,
                      "\"Hello, world\"\n"
                      "\n"
                      "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}\n"  // unclosed array on line 3
                      "\"never reached\"\n");
  CHECK(bad.status == 1);
  CHECK(bad.out == "[9707,11,1879]\n");  // output so far stays aligned; the run stops at the bad line
  CHECK(bad.err.rfind("line 3: ", 0) == 0);
  CHECK(bad.err.find("parse error") != std::string::npos);

  // The file-free path: reading the directory itself.
  std::istringstream in("\"Hello, world\"\n");
  std::ostringstream out, err;
  CHECK(qwen::run_tokenize(dir, in, out, err) == 0);
  CHECK(out.str() == "[9707,11,1879]\n");
}

TEST_CASE("run_tokenize names what is wrong with a line") {
  const auto tokenizer = qwen::Tokenizer::byte_level({"<|endoftext|>", "<|im_start|>", "<|im_end|>"});
  CHECK(run(tokenizer, "\"hi\"\n").out == "[104,105]\n");
  CHECK(run(tokenizer, "\"<|im_end|>\"\n").out == "[258]\n");
  CHECK(run(tokenizer, "  \n\r\n\"\"\n").out == "[]\n");  // blank lines write nothing; an empty string writes []

  const auto error_of = [&](const std::string& line) {
    const Run result = run(tokenizer, "\"ok\"\n" + line + "\n");
    CHECK(result.status == 1);
    CHECK(result.out == "[111,107]\n");
    return result.err;
  };
  CHECK(error_of("42").find("line 2: expected a JSON string or an object with \"messages\", not number") == 0);
  CHECK(error_of(R"({"text": "hi"})").find("an object without \"messages\"") != std::string::npos);
  CHECK(error_of(R"({"messages": [{"role": "tool", "content": "x"}]})").find("messages[0].role is \"tool\"") !=
        std::string::npos);
  CHECK(error_of(R"({"messages": [{"role": "user"}]})").find("messages[0] needs both") != std::string::npos);
  CHECK(error_of(R"({"messages": [], "add_generation_prompt": true})").find("messages is empty") != std::string::npos);
  CHECK(error_of(R"({"messages": [{"role": "user", "content": "x"}], "add_generation_prompt": 1})")
            .find("\"add_generation_prompt\" must be true or false") != std::string::npos);
  CHECK(error_of(R"({"messages": [{"role": "user", "content": "x"}], "tools": []})").find("unknown key \"tools\"") !=
        std::string::npos);
}

TEST_CASE("run_tokenize reports a tokenizer directory that cannot be loaded") {
  std::istringstream in("\"hi\"\n");
  std::ostringstream out, err;
  CHECK(qwen::run_tokenize(std::filesystem::path("/nonexistent/tokenizer/dir"), in, out, err) == 2);
  CHECK(out.str().empty());
  CHECK(err.str().find("cannot load the tokenizer: /nonexistent/tokenizer/dir: not a directory") == 0);
}
