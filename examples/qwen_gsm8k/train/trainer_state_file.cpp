// trainer_state.json: every field checked, every error naming the file and the field.
#include "qwen_gsm8k/train/trainer_state_file.hpp"

#include <limits>
#include <stdexcept>

#include "qwen_gsm8k/common/json_error.hpp"

namespace qwen {
namespace {

[[noreturn]] void state_error(const std::string& source, const std::string& message) {
  throw std::runtime_error(source + ": " + message + " (a damaged checkpoint? resume from an earlier one)");
}

// A value as the message shows it: its JSON, cut short.
std::string shown(const nlohmann::json& value) {
  std::string text = value.dump();
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  return text;
}

const nlohmann::json& field(const nlohmann::json& state, const char* key, const std::string& source) {
  const auto found = state.find(key);
  if (found == state.end()) state_error(source, std::string("field \"") + key + "\" is missing");
  return *found;
}

uint64_t non_negative_integer(const nlohmann::json& state, const char* key, uint64_t largest,
                              const std::string& source) {
  const nlohmann::json& value = field(state, key, source);
  uint64_t number = 0;
  if (value.is_number_unsigned()) {
    number = value.get<uint64_t>();
  } else if (value.is_number_integer() && value.get<int64_t>() >= 0) {
    number = static_cast<uint64_t>(value.get<int64_t>());
  } else {
    state_error(source, std::string("field \"") + key + "\" is " + shown(value) + ", expected an integer >= 0");
  }
  if (number > largest) state_error(source, std::string("field \"") + key + "\" is " + shown(value) + ", too large");
  return number;
}

const nlohmann::json& object_field(const nlohmann::json& state, const char* key, const std::string& source) {
  const nlohmann::json& value = field(state, key, source);
  if (!value.is_object())
    state_error(source, std::string("field \"") + key + "\" is " + shown(value) + ", expected an object");
  return value;
}

}  // namespace

TrainerStateFile parse_trainer_state(std::string_view text, const std::string& source) {
  if (text.empty()) state_error(source, "the file is empty");
  nlohmann::json state;
  try {
    state = nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception& error) {
    state_error(source, "invalid JSON " + json_error_where(error) + " of " + std::to_string(text.size()));
  }
  if (!state.is_object()) state_error(source, "the top level is " + shown(state) + ", expected a JSON object");
  constexpr auto kInt64 = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  constexpr auto kSize = static_cast<uint64_t>(std::numeric_limits<std::size_t>::max());
  TrainerStateFile parsed;
  parsed.step = static_cast<int64_t>(non_negative_integer(state, "step", kInt64, source));
  parsed.updates = static_cast<int64_t>(non_negative_integer(state, "updates", kInt64, source));
  parsed.sampler = object_field(state, "sampler", source);
  parsed.options = object_field(state, "options", source);
  parsed.metrics_rows = static_cast<std::size_t>(non_negative_integer(state, "metrics_rows", kSize, source));
  parsed.eval_rows = static_cast<std::size_t>(non_negative_integer(state, "eval_rows", kSize, source));
  return parsed;
}

nlohmann::json to_json(const TrainerStateFile& state) {
  return {{"step", state.step},       {"updates", state.updates},           {"sampler", state.sampler},
          {"options", state.options}, {"metrics_rows", state.metrics_rows}, {"eval_rows", state.eval_rows}};
}

}  // namespace qwen
