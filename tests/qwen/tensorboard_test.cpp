// TensorBoard event files and the metric log: CRC-32C check values, TFRecord framing, the Event bytes of a scalar
// checked by hand against the protobuf wire format, and the files a MetricLog writes. The whole file read back by an
// independent reader is tests/qwen/tfevents_check.py (ctest: tfevents).
#include <doctest/doctest.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <stdexcept>

#include "qwen_gsm8k/common/json_lines.hpp"
#include "qwen_gsm8k/logging/metric_log.hpp"
#include "qwen_gsm8k/logging/tensorboard.hpp"
#include "support/qwen_fixtures.hpp"

namespace {

std::string bytes(std::initializer_list<int> values) {
  std::string out;
  for (const int value : values) out.push_back(static_cast<char>(value));
  return out;
}

std::string read_all(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

TEST_CASE("crc32c: the standard check values and TFRecord's mask") {
  CHECK(qwen::crc32c("") == 0u);
  CHECK(qwen::crc32c("123456789") == 0xE3069283u);            // the CRC-32C check value (RFC 3720)
  CHECK(qwen::crc32c(std::string(32, '\0')) == 0x8A9136AAu);  // RFC 3720 B.4: 32 bytes of zeros
  CHECK(qwen::crc32c(std::string(32, '\xff')) == 0x62A8AB43u);
  const uint32_t crc = qwen::crc32c("123456789");
  CHECK(qwen::masked_crc32c("123456789") == (((crc >> 15) | (crc << 17)) + 0xA282EAD8u));
}

TEST_CASE("tfrecord: length, its masked CRC, the data, the data's masked CRC") {
  const std::string record = qwen::tfrecord("abc");
  REQUIRE(record.size() == 8 + 4 + 3 + 4);
  CHECK(record.substr(0, 8) == bytes({3, 0, 0, 0, 0, 0, 0, 0}));
  uint32_t length_crc = 0, data_crc = 0;
  std::memcpy(&length_crc, record.data() + 8, 4);
  std::memcpy(&data_crc, record.data() + 15, 4);
  CHECK(length_crc == qwen::masked_crc32c(record.substr(0, 8)));
  CHECK(record.substr(12, 3) == "abc");
  CHECK(data_crc == qwen::masked_crc32c("abc"));
}

TEST_CASE("Event bytes: file_version and a scalar, by the wire format") {
  // wall_time 0.0 (field 1, fixed64) then file_version (field 3, length-delimited).
  CHECK(qwen::file_version_event(0.0) == bytes({0x09, 0, 0, 0, 0, 0, 0, 0, 0, 0x1A, 13}) + "brain.Event:2");
  // step 300 = varint AC 02 (field 2); summary (field 5) { value (field 1) { tag "a" (field 1), simple_value 1.0f
  // (field 2, fixed32 00 00 80 3F) } }.
  const std::string event = qwen::scalars_event(0.0, 300, {{"a", 1.0}});
  const std::string value = bytes({0x0A, 1, 'a', 0x15, 0, 0, static_cast<char>(0x80), 0x3F});
  const std::string summary = bytes({0x0A, static_cast<int>(value.size())}) + value;
  CHECK(event == bytes({0x09, 0, 0, 0, 0, 0, 0, 0, 0, 0x10, static_cast<char>(0xAC), 0x02, 0x2A,
                        static_cast<int>(summary.size())}) +
                     summary);
}

TEST_CASE("row_scalars: the numbers and booleans of a row, without step, lists or text") {
  const nlohmann::json row{{"step", 3},      {"actor/lr", 1e-6}, {"dapo/kept_groups", 4}, {"flag", true},
                           {"list", {1, 2}}, {"name", "x"},      {"nested", {{"a", 1}}}};
  const auto scalars = qwen::row_scalars(row);
  REQUIRE(scalars.size() == 3);
  CHECK(scalars[0] == std::pair<std::string, double>{"actor/lr", 1e-6});
  CHECK(scalars[1] == std::pair<std::string, double>{"dapo/kept_groups", 4});
  CHECK(scalars[2] == std::pair<std::string, double>{"flag", 1.0});
}

TEST_CASE("MetricLog: the loggers asked for, and nothing for other ranks or unknown names") {
  dapo::test::ScratchDir dir;
  {
    qwen::MetricLog log(dir.path() / "all", {"console", "jsonl", "tensorboard"}, true);
    log.log_step({{"step", 1}, {"actor/lr", 0.5}});
    log.log_eval({{"step", 1}, {"accuracy", 0.25}});
  }
  CHECK(qwen::read_json_lines(dir.path() / "all" / "metrics.jsonl").size() == 1);
  CHECK(qwen::read_json_lines(dir.path() / "all" / "eval.jsonl").size() == 1);
  std::vector<std::filesystem::path> events;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path() / "all")) {
    if (entry.path().filename().string().rfind("events.out.tfevents.", 0) == 0) events.push_back(entry.path());
  }
  REQUIRE(events.size() == 1);
  const std::string file = read_all(events[0]);
  CHECK(file.rfind(qwen::tfrecord(file.substr(12, 24)), 0) == 0);  // a whole first record: 24 bytes of file_version
  CHECK(file.find("actor/lr") != std::string::npos);
  CHECK(file.find("eval/accuracy") != std::string::npos);

  {
    qwen::MetricLog log(dir.path() / "jsonl", {"jsonl"}, true);
    log.log_step({{"step", 1}, {"actor/lr", 0.5}});
    qwen::MetricLog other_rank(dir.path() / "rank1", {"jsonl", "tensorboard"}, false);
    other_rank.log_step({{"step", 1}, {"actor/lr", 0.5}});
  }
  CHECK(std::distance(std::filesystem::directory_iterator(dir.path() / "jsonl"), {}) == 1);  // no event file
  CHECK_FALSE(std::filesystem::exists(dir.path() / "rank1"));
  CHECK_THROWS_WITH_AS(qwen::MetricLog(dir.path(), {"jsonl", "wandb"}, true),
                       "logger \"wandb\" is not one of console, jsonl, tensorboard", std::invalid_argument);
}
