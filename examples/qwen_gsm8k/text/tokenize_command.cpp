// `qwen_gsm8k tokenize`: reads JSON lines, writes token-id lines; see tokenize_command.hpp for the format.
#include "qwen_gsm8k/text/tokenize_command.hpp"

#include <nlohmann/json.hpp>

#include <exception>
#include <istream>
#include <optional>
#include <ostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "qwen_gsm8k/text/chat.hpp"

namespace qwen {
namespace {

using nlohmann::json;

std::vector<ChatMessage> parse_messages(const json& messages) {
  if (!messages.is_array()) throw std::invalid_argument("\"messages\" must be an array of {\"role\", \"content\"}");
  std::vector<ChatMessage> parsed;
  for (std::size_t i = 0; i < messages.size(); ++i) {
    const json& message = messages[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!message.is_object()) throw std::invalid_argument(where + " must be an object {\"role\", \"content\"}");
    for (const auto& [key, value] : message.items()) {
      if (key != "role" && key != "content") throw std::invalid_argument(where + " has an unknown key \"" + key + "\"");
      if (!value.is_string()) throw std::invalid_argument(where + "." + key + " must be a string");
    }
    if (!message.contains("role") || !message.contains("content")) {
      throw std::invalid_argument(where + " needs both \"role\" and \"content\"");
    }
    parsed.push_back({message.at("role").get<std::string>(), message.at("content").get<std::string>()});
  }
  return parsed;
}

// The text a line asks to encode. Throws std::exception with the reason when the line is malformed.
std::string text_of_line(const std::string& line) {
  const json value = json::parse(line);
  if (value.is_string()) return value.get<std::string>();
  if (!value.is_object() || !value.contains("messages")) {
    throw std::invalid_argument(std::string("expected a JSON string or an object with \"messages\", not ") +
                                (value.is_object() ? "an object without \"messages\"" : value.type_name()));
  }
  bool add_generation_prompt = false;
  for (const auto& [key, field] : value.items()) {
    if (key == "add_generation_prompt") {
      if (!field.is_boolean()) throw std::invalid_argument("\"add_generation_prompt\" must be true or false");
      add_generation_prompt = field.get<bool>();
    } else if (key != "messages") {
      throw std::invalid_argument("unknown key \"" + key + "\" (expected \"messages\", \"add_generation_prompt\")");
    }
  }
  return render_chat(parse_messages(value.at("messages")), add_generation_prompt);
}

}  // namespace

int run_tokenize(const Tokenizer& tokenizer, std::istream& in, std::ostream& out, std::ostream& err) {
  std::string line;
  for (std::size_t line_number = 1; std::getline(in, line); ++line_number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    std::string text;
    try {
      text = text_of_line(line);
    } catch (const std::exception& error) {
      err << "line " << line_number << ": " << error.what() << "\n";
      return 1;
    }
    out << json(tokenizer.encode(text)).dump() << "\n";
  }
  return 0;
}

int run_tokenize(const std::filesystem::path& tokenizer_dir, std::istream& in, std::ostream& out, std::ostream& err) {
  std::optional<Tokenizer> tokenizer;
  try {
    tokenizer = Tokenizer::from_directory(tokenizer_dir);
  } catch (const std::exception& error) {
    err << "cannot load the tokenizer: " << error.what() << "\n";
    return 2;
  }
  return run_tokenize(*tokenizer, in, out, err);
}

}  // namespace qwen
