// TensorBoard event files without TensorFlow: the TFRecord framing (length, masked CRC-32C of the length, data, masked
// CRC-32C of the data) around hand-encoded `Event` protocol buffers, as torch.utils.tensorboard's SummaryWriter writes
// them: first an Event with file_version "brain.Event:2", then one Event per step whose Summary holds a Value with
// `tag` and `simple_value` per scalar (add_scalar's layout). Only scalars; no images, histograms or graphs.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace qwen {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as TFRecord uses; crc32c("123456789") = 0xE3069283.
uint32_t crc32c(std::string_view bytes);
// TFRecord's masked CRC: rotated right by 15 bits plus 0xA282EAD8 (so a CRC of data holding CRCs stays useful).
uint32_t masked_crc32c(std::string_view bytes);

// One TFRecord: uint64 little-endian length, masked CRC of those 8 bytes, the data, masked CRC of the data.
std::string tfrecord(std::string_view data);

// The serialized Event protos (wall_time = field 1 double, step = 2 int64, file_version = 3 string, summary = 5).
std::string file_version_event(double wall_time);
std::string scalars_event(double wall_time, int64_t step, const std::vector<std::pair<std::string, double>>& scalars);

// Appends events to output_dir/events.out.tfevents.<unix seconds>.<host>.<pid>.<n> (SummaryWriter's name; a new file
// per writer, so a resumed run adds a file beside the old one and TensorBoard reads both). Each step's record is
// written whole and flushed, so TensorBoard can read the file while training goes on. Throws std::runtime_error naming
// the file when it cannot be created or written.
class TensorBoardWriter {
 public:
  explicit TensorBoardWriter(const std::filesystem::path& output_dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // Scalars are stored as float32 (simple_value is a float), as add_scalar stores them.
  void add_scalars(int64_t step, const std::vector<std::pair<std::string, double>>& scalars);
  const std::filesystem::path& path() const { return path_; }

 private:
  void write(const std::string& record);
  std::filesystem::path path_;
  std::FILE* file_ = nullptr;
};

}  // namespace qwen
