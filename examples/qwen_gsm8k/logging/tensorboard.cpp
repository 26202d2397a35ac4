// TensorBoard event files: TFRecord framing and the few protobuf fields an Event with scalars needs.
#include "qwen_gsm8k/logging/tensorboard.hpp"

#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <stdexcept>

#include "qwen_gsm8k/common/run_directory.hpp"

namespace qwen {
namespace {

constexpr std::array<uint32_t, 256> crc32c_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t byte = 0; byte < 256; ++byte) {
    uint32_t crc = byte;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1u) != 0 ? 0x82F63B78u : 0u);
    table[byte] = crc;
  }
  return table;
}
constexpr auto kCrc32cTable = crc32c_table();

// Protocol buffer wire format: field key = number << 3 | wire type (0 varint, 1 fixed64, 2 length-delimited,
// 5 fixed32); integers little-endian.
void put_varint(std::string& out, uint64_t value) {
  while (value >= 0x80) {
    out.push_back(static_cast<char>((value & 0x7F) | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
}
void put_key(std::string& out, int field, int wire_type) {
  put_varint(out, static_cast<uint64_t>(field) << 3 | static_cast<uint64_t>(wire_type));
}
template <class T>
void put_little_endian(std::string& out, T value) {
  unsigned char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));  // x86 and arm64 are little-endian, as the format
  out.append(reinterpret_cast<const char*>(bytes), sizeof(T));
}
void put_bytes(std::string& out, int field, std::string_view bytes) {
  put_key(out, field, 2);
  put_varint(out, bytes.size());
  out.append(bytes);
}
void put_double(std::string& out, int field, double value) {
  put_key(out, field, 1);
  put_little_endian(out, value);
}

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) return "localhost";
  return name;
}

}  // namespace

uint32_t crc32c(std::string_view bytes) {
  uint32_t crc = 0xFFFFFFFFu;
  for (const char c : bytes) crc = (crc >> 8) ^ kCrc32cTable[(crc ^ static_cast<unsigned char>(c)) & 0xFFu];
  return crc ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(std::string_view bytes) {
  const uint32_t crc = crc32c(bytes);
  return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u;
}

std::string tfrecord(std::string_view data) {
  std::string record;
  put_little_endian(record, static_cast<uint64_t>(data.size()));
  put_little_endian(record, masked_crc32c(record));
  record.append(data);
  put_little_endian(record, masked_crc32c(data));
  return record;
}

std::string file_version_event(double wall_time) {
  std::string event;
  put_double(event, 1, wall_time);
  put_bytes(event, 3, "brain.Event:2");
  return event;
}

std::string scalars_event(double wall_time, int64_t step, const std::vector<std::pair<std::string, double>>& scalars) {
  std::string summary;
  for (const auto& [tag, value] : scalars) {
    std::string entry;  // Summary.Value: tag = 1, simple_value = 2 (float)
    put_bytes(entry, 1, tag);
    put_key(entry, 2, 5);
    put_little_endian(entry, static_cast<float>(value));
    put_bytes(summary, 1, entry);  // Summary.value = 1 (repeated)
  }
  std::string event;
  put_double(event, 1, wall_time);
  put_key(event, 2, 0);
  put_varint(event, static_cast<uint64_t>(step));
  put_bytes(event, 5, summary);
  return event;
}

TensorBoardWriter::TensorBoardWriter(const std::filesystem::path& output_dir) {
  static std::atomic<int> writers{0};
  const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  char name[512];
  std::snprintf(name, sizeof name, "%s%010lld.%s.%d.%d", RunDirectory::kEventsPrefix, static_cast<long long>(now),
                host_name().c_str(), static_cast<int>(getpid()), writers++);
  std::filesystem::create_directories(output_dir);
  path_ = output_dir / name;
  file_ = std::fopen(path_.c_str(), "wb");
  if (file_ == nullptr) {
    throw std::runtime_error(path_.string() + ": cannot create the TensorBoard event file: " + std::strerror(errno));
  }
  write(tfrecord(file_version_event(now)));
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

void TensorBoardWriter::add_scalars(int64_t step, const std::vector<std::pair<std::string, double>>& scalars) {
  const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  write(tfrecord(scalars_event(now, step, scalars)));
}

void TensorBoardWriter::write(const std::string& record) {
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size() || std::fflush(file_) != 0) {
    throw std::runtime_error(path_.string() + ": write failed (" + std::strerror(errno) + "; disk full?)");
  }
}

}  // namespace qwen
