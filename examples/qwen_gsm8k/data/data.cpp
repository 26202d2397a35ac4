// GSM8K JSON lines: one problem per line, every malformed line named by file and line; and the seeded sampler.
#include "qwen_gsm8k/data/data.hpp"

#include <dapo/rewards/gsm8k.hpp>

#include <charconv>
#include <fstream>
#include <random>
#include <stdexcept>
#include <string_view>
#include <system_error>
#include <utility>

#include "qwen_gsm8k/common/json_error.hpp"
#include "qwen_gsm8k/common/seed.hpp"

namespace qwen {
namespace {

constexpr std::string_view kWhitespace = " \t\r\n";

// Thrown for one bad line; load_problems adds the file and line, or counts it under BadLines::kSkip.
struct BadLine {
  std::string what;
  std::string hint = {};
};

// A JSON value for a message, cut to a readable length.
std::string shown(const nlohmann::json& value) {
  std::string text = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  return text;
}

std::string_view trimmed(std::string_view text) {
  const auto first = text.find_first_not_of(kWhitespace);
  if (first == std::string_view::npos) return {};
  return text.substr(first, text.find_last_not_of(kWhitespace) - first + 1);
}

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

// "-?D+(,DDD)*(.D+)?" with D+ of 1-3 digits before any group, in canonical form (see load_problems); or nothing.
std::optional<std::string> normalised_number_text(std::string_view text) {
  text = trimmed(text);
  std::size_t pos = 0;
  const bool negative = pos < text.size() && text[pos] == '-';
  if (negative) ++pos;
  auto digits_from = [&](std::size_t at) {
    std::size_t end = at;
    while (end < text.size() && is_digit(text[end])) ++end;
    return end - at;
  };
  std::string whole;
  const std::size_t head = digits_from(pos);
  if (head == 0) return std::nullopt;
  whole.append(text.substr(pos, head));
  pos += head;
  if (pos < text.size() && text[pos] == ',') {
    if (head > 3) return std::nullopt;
    while (pos < text.size() && text[pos] == ',') {
      if (digits_from(pos + 1) != 3) return std::nullopt;
      whole.append(text.substr(pos + 1, 3));
      pos += 4;
    }
  }
  std::string fraction;
  if (pos < text.size() && text[pos] == '.') {
    const std::size_t tail = digits_from(pos + 1);
    if (tail == 0) return std::nullopt;
    fraction = text.substr(pos + 1, tail);
    pos += 1 + tail;
  }
  if (pos != text.size()) return std::nullopt;
  whole.erase(0, std::min(whole.find_first_not_of('0'), whole.size() - 1));  // "007" -> "7", "000" -> "0"
  while (!fraction.empty() && fraction.back() == '0') fraction.pop_back();
  std::string number = whole + (fraction.empty() ? "" : "." + fraction);
  return negative && number != "0" ? "-" + number : number;
}

std::string normalised_json_number(const nlohmann::json& value) {
  if (value.is_number_unsigned()) return std::to_string(value.get<uint64_t>());
  if (value.is_number_integer()) return std::to_string(value.get<int64_t>());
  // Shortest fixed notation that reads back as the same double: 3.5 -> "3.5", 72.0 -> "72", 1e3 -> "1000".
  char buffer[512];
  const auto [end, error] =
      std::to_chars(buffer, buffer + sizeof buffer, value.get<double>(), std::chars_format::fixed);
  if (error != std::errc()) throw BadLine{"the number " + shown(value) + " is too long to write as a decimal"};
  std::string number(buffer, end);
  return number == "-0" ? "0" : number;
}

std::string field_names(const nlohmann::json& object) {
  std::string present;
  for (const auto& [key, value] : object.items()) present += (present.empty() ? "\"" : ", \"") + key + "\"";
  return present.empty() ? "no fields" : present;
}

// object[name], where a name with dots that is not itself a key is a path: "prompt.0.content" is
// object["prompt"][0]["content"] (verl's preprocessed GSM8K), each part an object key or a list index.
const nlohmann::json& field(const nlohmann::json& object, const std::string& name) {
  if (object.contains(name)) return object.at(name);
  const nlohmann::json* at = &object;
  std::string walked;
  for (std::size_t begin = 0; begin <= name.size();) {
    const std::size_t end = std::min(name.find('.', begin), name.size());
    const std::string part = name.substr(begin, end - begin);
    const std::string where = walked.empty() ? "the line" : "\"" + walked + "\"";
    if (at->is_object() && at->contains(part)) {
      at = &at->at(part);
    } else if (at->is_array() && !part.empty() && part.find_first_not_of("0123456789") == std::string::npos &&
               part.size() < 10 && std::stoul(part) < at->size()) {
      at = &(*at)[std::stoul(part)];
    } else if (at->is_array()) {
      throw BadLine{"no field \"" + name + "\": " + where + " is a list of " + std::to_string(at->size()) + " and \"" +
                        part + "\" is not an index in it",
                    "a dotted field name is a path of object keys and list indices"};
    } else if (at->is_object()) {
      throw BadLine{"no field \"" + name + "\" (" + where + " has " + field_names(*at) + ")",
                    "--question-field and --answer-field name the fields, --data-preset gsm8k, gsm8k_chinese or verl "
                    "a known layout; dots separate the parts of a path"};
    } else {
      throw BadLine{"no field \"" + name + "\": " + where + " is " + shown(*at) + ", not an object or a list"};
    }
    walked += (walked.empty() ? "" : ".") + part;
    begin = end + 1;
  }
  return *at;
}

// A list of chat messages (verl's "prompt"): its last user message's content; any other value as it is.
const nlohmann::json& chat_user_turn(const nlohmann::json& value, const std::string& name) {
  if (!value.is_array()) return value;
  for (auto message = value.rbegin(); message != value.rend(); ++message) {
    if (message->is_object() && message->contains("role") && message->at("role") == "user" &&
        message->contains("content")) {
      return message->at("content");
    }
  }
  throw BadLine{
      "field \"" + name + "\" is a list with no {\"role\": \"user\", \"content\": ...} message: " + shown(value),
      "a list question field is read as chat messages"};
}

std::string reference_of(const nlohmann::json& answer, const DataFields& fields) {
  const std::string& name = fields.answer;
  if (fields.format == AnswerFormat::kNumber) {
    if (answer.is_number()) return normalised_json_number(answer);
    if (answer.is_string()) {
      if (auto number = normalised_number_text(answer.get_ref<const std::string&>())) return *std::move(number);
    }
    throw BadLine{"field \"" + name + "\" is " + shown(answer) +
                  ", expected a number such as 72, -7, 3.5 or a numeric string such as \"1,080\""};
  }
  if (!answer.is_string()) {
    throw BadLine{"field \"" + name + "\" is " + shown(answer) + ", expected a string ending in \"#### N\"",
                  "--answer-format number reads a numeric answer field"};
  }
  const auto& text = answer.get_ref<const std::string&>();
  if (text.find("####") == std::string::npos) {
    throw BadLine{"field \"" + name + "\" has no \"####\" before the final answer: " + shown(answer),
                  "GSM8K answers end in \"#### N\"; --answer-format number reads a field that is the answer itself"};
  }
  try {
    return dapo::gsm8k::reference_answer(text);
  } catch (const std::invalid_argument&) {
    throw BadLine{"field \"" + name + "\" has nothing after \"####\": " + shown(answer)};
  }
}

Problem problem_of(std::string_view line, const DataFields& fields) {
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& error) {
    // nlohmann's message is "[json.exception...] parse error at line 1, column N: what"; the byte says where.
    const std::string message = error.what();
    const auto detail = message.find(": ");
    throw BadLine{"invalid JSON " + json_error_where(error) + ": " +
                  (detail == std::string::npos ? message : message.substr(detail + 2))};
  }
  if (!json.is_object()) throw BadLine{"expected a JSON object, got " + shown(json)};
  const auto& question = chat_user_turn(field(json, fields.question), fields.question);
  if (!question.is_string()) {
    throw BadLine{"field \"" + fields.question + "\" is " + shown(question) + ", expected a string"};
  }
  if (trimmed(question.get_ref<const std::string&>()).empty()) {
    throw BadLine{"field \"" + fields.question + "\" is empty"};
  }
  return Problem{question.get<std::string>(), reference_of(field(json, fields.answer), fields)};
}

// Uniform in [0, bound) by rejection, so no modulo bias and nothing implementation-defined.
uint64_t uniform_below(std::mt19937_64& engine, uint64_t bound) {
  const uint64_t threshold = (0 - bound) % bound;  // 2^64 mod bound: the values below it would be over-represented
  for (;;) {
    const uint64_t value = engine();
    if (value >= threshold) return value % bound;
  }
}

[[noreturn]] void bad_state(const std::string& message) {
  throw std::invalid_argument("qwen::ProblemSampler::from_state: " + message);
}

uint64_t state_field(const nlohmann::json& state, const char* key) {
  if (!state.contains(key)) bad_state(std::string("missing field \"") + key + "\" in " + shown(state));
  const auto& value = state.at(key);
  if (value.is_number_unsigned()) return value.get<uint64_t>();
  if (value.is_number_integer() && value.get<int64_t>() >= 0) return static_cast<uint64_t>(value.get<int64_t>());
  bad_state(std::string("field \"") + key + "\" is " + shown(value) + ", expected a non-negative integer");
}

}  // namespace

DataFields data_preset(const std::string& name) {
  if (name == "gsm8k") return {};
  if (name == "gsm8k_chinese")
    return {.question = "question_zh-cn", .answer = "answer_only", .format = AnswerFormat::kNumber};
  if (name == "verl")
    return {.question = "prompt", .answer = "reward_model.ground_truth", .format = AnswerFormat::kNumber};
  throw std::invalid_argument("data preset \"" + name + "\" is not one of gsm8k, gsm8k_chinese, verl");
}

Dataset load_problems(const std::filesystem::path& file, const DataFields& fields, BadLines bad) {
  if (std::filesystem::is_directory(file)) {
    throw std::runtime_error(file.string() + ": is a directory (hint: pass a JSON lines file such as train.jsonl)");
  }
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    throw std::runtime_error(file.string() +
                             ": cannot open the problem file (hint: GSM8K's train.jsonl or test.jsonl)");
  }
  Dataset dataset;
  dataset.source = file;
  std::string line;
  int64_t line_number = 0;
  while (std::getline(in, line)) {
    ++line_number;
    std::string_view text = line;
    if (line_number == 1 && text.starts_with("\xEF\xBB\xBF")) text.remove_prefix(3);  // a UTF-8 byte order mark
    if (trimmed(text).empty()) continue;
    try {
      dataset.problems.push_back(problem_of(text, fields));
    } catch (const BadLine& error) {
      if (bad == BadLines::kSkip) {
        ++dataset.skipped_lines;
        continue;
      }
      throw std::invalid_argument(file.string() + ":" + std::to_string(line_number) + ": " + error.what + " (hint: " +
                                  (error.hint.empty() ? "" : error.hint + "; ") + "--skip-bad-lines skips bad lines)");
    }
  }
  if (in.bad()) throw std::runtime_error(file.string() + ": read error after line " + std::to_string(line_number));
  if (dataset.problems.empty()) {
    throw std::invalid_argument(file.string() + ": no problems in " + std::to_string(line_number) + " lines (" +
                                std::to_string(dataset.skipped_lines) + " malformed lines skipped; hint: one JSON " +
                                "object per line with the fields \"" + fields.question + "\" and \"" + fields.answer +
                                "\")");
  }
  return dataset;
}

ProblemSampler::ProblemSampler(std::size_t count, uint64_t seed) : count_(count), seed_(seed) {
  if (count == 0) throw std::invalid_argument("qwen::ProblemSampler: count is 0, expected at least one problem");
  shuffle_epoch();
}

void ProblemSampler::shuffle_epoch() {
  // The epoch's own seed depends on (seed, epoch) only; splitmix64 decorrelates neighbouring seeds and epochs.
  std::mt19937_64 engine(splitmix64(seed_ ^ splitmix64(static_cast<uint64_t>(epoch_))));
  order_.resize(count_);
  for (std::size_t i = 0; i < count_; ++i) order_[i] = i;
  for (std::size_t i = count_ - 1; i > 0; --i) std::swap(order_[i], order_[uniform_below(engine, i + 1)]);
}

std::vector<std::size_t> ProblemSampler::next(std::size_t n) {
  std::vector<std::size_t> indices;
  indices.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    indices.push_back(order_[position_]);
    if (++position_ == count_) {  // keep position < count: the next draw always comes from the current epoch
      ++epoch_;
      position_ = 0;
      shuffle_epoch();
    }
  }
  return indices;
}

nlohmann::json ProblemSampler::state() const {
  return {{"seed", seed_}, {"count", count_}, {"epoch", epoch_}, {"position", position_}};
}

ProblemSampler ProblemSampler::from_state(const nlohmann::json& state) {
  if (!state.is_object())
    bad_state("expected an object {\"seed\", \"count\", \"epoch\", \"position\"}, got " + shown(state));
  const uint64_t seed = state_field(state, "seed");
  const uint64_t count = state_field(state, "count");
  const uint64_t epoch = state_field(state, "epoch");
  const uint64_t position = state_field(state, "position");
  if (count == 0) bad_state("field \"count\" is 0, expected at least one problem");
  if (epoch > static_cast<uint64_t>(INT64_MAX))
    bad_state("field \"epoch\" is " + std::to_string(epoch) + ", too large");
  if (position >= count) {
    bad_state("field \"position\" is " + std::to_string(position) + ", expected less than count " +
              std::to_string(count));
  }
  ProblemSampler sampler(static_cast<std::size_t>(count), seed);
  sampler.epoch_ = static_cast<int64_t>(epoch);
  sampler.position_ = static_cast<std::size_t>(position);
  sampler.shuffle_epoch();
  return sampler;
}

}  // namespace qwen
