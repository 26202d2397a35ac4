// Reading safetensors through mmap, with the header checked field by field; writing them atomically.
#include "qwen_gsm8k/model/safetensors.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <dapo/core/error.hpp>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <ostream>
#include <set>
#include <stdexcept>

#include "qwen_gsm8k/common/atomic_file.hpp"

namespace qwen {
namespace {

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the reference implementation's limit

struct DtypeName {
  const char* name;
  torch::ScalarType dtype;
};
constexpr DtypeName kDtypes[] = {{"F64", torch::kFloat64},   {"F32", torch::kFloat32}, {"F16", torch::kFloat16},
                                 {"BF16", torch::kBFloat16}, {"I64", torch::kInt64},   {"I32", torch::kInt32},
                                 {"I16", torch::kInt16},     {"I8", torch::kInt8},     {"U8", torch::kUInt8},
                                 {"BOOL", torch::kBool}};

[[noreturn]] void fail(const std::filesystem::path& path, const std::string& message) {
  throw std::runtime_error(path.string() + ": " + message);
}

// One tensor's header entry, every field checked against the file: dtype known, shape sizes, byte range inside the
// data section and of the size the shape and dtype imply.
SafetensorsEntry parse_entry(const std::filesystem::path& path, const std::string& name, const nlohmann::json& value,
                             std::size_t data_start, std::size_t data_bytes) {
  const std::string where = "tensor \"" + name + "\"";
  if (!value.is_object() || !value.contains("dtype") || !value.contains("shape") || !value.contains("data_offsets")) {
    fail(path, where + " lacks dtype, shape or data_offsets");
  }
  SafetensorsEntry entry;
  entry.name = name;
  if (!value.at("dtype").is_string()) fail(path, where + ": dtype is not a string");
  entry.dtype_name = value.at("dtype").get<std::string>();
  bool known = false;
  for (const auto& dtype : kDtypes) {
    if (entry.dtype_name == dtype.name) {
      entry.dtype = dtype.dtype;
      known = true;
    }
  }
  if (!known) fail(path, where + ": unknown dtype \"" + entry.dtype_name + "\" (expected F32, BF16, F16, ...)");
  if (!value.at("shape").is_array()) fail(path, where + ": shape is not a list");
  for (const auto& extent : value.at("shape")) {
    if (!extent.is_number_unsigned()) fail(path, where + ": shape holds " + extent.dump() + ", expected sizes >= 0");
    entry.shape.push_back(extent.get<int64_t>());
  }
  const auto& offsets = value.at("data_offsets");
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned()) {
    fail(path, where + ": data_offsets is " + offsets.dump() + ", expected [begin, end]");
  }
  entry.begin = offsets[0].get<uint64_t>();
  entry.end = offsets[1].get<uint64_t>();
  if (entry.begin > entry.end || entry.end > data_bytes) {
    fail(path, where + ": data_offsets [" + std::to_string(entry.begin) + ", " + std::to_string(entry.end) +
                   "] fall outside the data section of " + std::to_string(data_bytes) + " bytes (file offset " +
                   std::to_string(data_start) + "; truncated file?)");
  }
  const int64_t elements = std::accumulate(entry.shape.begin(), entry.shape.end(), int64_t{1}, std::multiplies<>());
  const uint64_t expected = static_cast<uint64_t>(elements) * c10::elementSize(entry.dtype);
  if (entry.end - entry.begin != expected) {
    fail(path, where + ": " + std::to_string(entry.end - entry.begin) + " bytes for shape " +
                   dapo::shape_string(entry.shape) + " of " + entry.dtype_name + ", expected " +
                   std::to_string(expected));
  }
  return entry;
}

}  // namespace

std::string safetensors_dtype_name(torch::ScalarType dtype) {
  for (const auto& known : kDtypes) {
    if (known.dtype == dtype) return known.name;
  }
  throw std::invalid_argument(std::string("safetensors has no dtype for ") + c10::toString(dtype));
}

SafetensorsFile SafetensorsFile::open(const std::filesystem::path& path) {
  SafetensorsFile file;
  file.path_ = path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, std::string("cannot open: ") + std::strerror(errno));
  struct stat status {};
  if (::fstat(fd, &status) != 0) {
    ::close(fd);
    fail(path, std::string("cannot stat: ") + std::strerror(errno));
  }
  file.size_ = static_cast<std::size_t>(status.st_size);
  if (file.size_ < 8) {
    ::close(fd);
    fail(path, "is " + std::to_string(file.size_) + " bytes, too short for the 8-byte header length (truncated?)");
  }
  void* mapping = ::mmap(nullptr, file.size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (mapping == MAP_FAILED) fail(path, std::string("cannot mmap: ") + std::strerror(errno));
  file.mapping_ = static_cast<const std::byte*>(mapping);

  uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, file.mapping_, 8);  // little-endian, as on every platform LibTorch runs on
  if (header_bytes > kMaxHeaderBytes || header_bytes > file.size_ - 8) {
    fail(path, "header length " + std::to_string(header_bytes) + " (bytes 0..8) exceeds the file size " +
                   std::to_string(file.size_) + " or the 100 MB limit (truncated or not a safetensors file?)");
  }
  file.data_start_ = 8 + header_bytes;
  const std::size_t data_bytes = file.size_ - file.data_start_;
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(reinterpret_cast<const char*>(file.mapping_) + 8,
                                   reinterpret_cast<const char*>(file.mapping_) + 8 + header_bytes);
  } catch (const nlohmann::json::parse_error& error) {
    fail(path, "header is not valid JSON at byte " + std::to_string(8 + error.byte) + " of the file");
  }
  if (!header.is_object()) fail(path, "header is not a JSON object");

  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      if (!value.is_object()) fail(path, "__metadata__ is not an object");
      for (const auto& [key, text] : value.items()) {
        if (!text.is_string()) fail(path, "__metadata__[\"" + key + "\"] is not a string");
        file.metadata_[key] = text.get<std::string>();
      }
      continue;
    }
    SafetensorsEntry entry = parse_entry(path, name, value, file.data_start_, data_bytes);
    ranges.emplace_back(entry.begin, entry.end);
    file.entries_.push_back(std::move(entry));
  }
  std::sort(ranges.begin(), ranges.end());
  for (std::size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first < ranges[i - 1].second) {
      fail(path, "tensors overlap at data offset " + std::to_string(ranges[i].first));
    }
  }
  return file;
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& other) noexcept
    : path_(std::move(other.path_)),
      mapping_(std::exchange(other.mapping_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      data_start_(other.data_start_),
      entries_(std::move(other.entries_)),
      metadata_(std::move(other.metadata_)) {}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& other) noexcept {
  if (this != &other) {
    if (mapping_ != nullptr) ::munmap(const_cast<std::byte*>(mapping_), size_);
    path_ = std::move(other.path_);
    mapping_ = std::exchange(other.mapping_, nullptr);
    size_ = std::exchange(other.size_, 0);
    data_start_ = other.data_start_;
    entries_ = std::move(other.entries_);
    metadata_ = std::move(other.metadata_);
  }
  return *this;
}

SafetensorsFile::~SafetensorsFile() {
  if (mapping_ != nullptr) ::munmap(const_cast<std::byte*>(mapping_), size_);
}

const SafetensorsEntry* SafetensorsFile::find(const std::string& name) const {
  for (const auto& entry : entries_) {
    if (entry.name == name) return &entry;
  }
  return nullptr;
}

torch::Tensor SafetensorsFile::view(const SafetensorsEntry& entry) const {
  void* data = const_cast<std::byte*>(mapping_ + data_start_ + entry.begin);
  return torch::from_blob(data, entry.shape, torch::TensorOptions().dtype(entry.dtype));
}

void SafetensorsFile::release(const SafetensorsEntry& entry, uint64_t first_byte, uint64_t last_byte) const {
  const long page = ::sysconf(_SC_PAGESIZE);
  const uint64_t bytes = entry.end - entry.begin;
  const auto first = reinterpret_cast<uintptr_t>(mapping_ + data_start_ + entry.begin + std::min(first_byte, bytes));
  const auto last = reinterpret_cast<uintptr_t>(mapping_ + data_start_ + entry.begin + std::min(last_byte, bytes));
  const uintptr_t aligned_first = (first + page - 1) / page * page;  // whole pages inside the tensor only
  const uintptr_t aligned_last = last / page * page;
  if (aligned_last > aligned_first) {
    ::madvise(reinterpret_cast<void*>(aligned_first), aligned_last - aligned_first, MADV_DONTNEED);
  }
}

void write_safetensors(const std::filesystem::path& path,
                       const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<torch::Tensor> contiguous;
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    if (!names.insert(name).second) {
      throw std::invalid_argument(path.string() + ": tensor name \"" + name + "\" repeats");
    }
    torch::Tensor data = tensor.detach().to(torch::kCPU).contiguous();
    const uint64_t bytes = static_cast<uint64_t>(data.numel()) * data.element_size();
    header[name] = {{"dtype", safetensors_dtype_name(data.scalar_type())},
                    {"shape", data.sizes().vec()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    contiguous.push_back(std::move(data));
  }
  std::string header_text = header.dump();
  header_text.append((8 - header_text.size() % 8) % 8, ' ');  // keeps the data section 8-byte aligned
  const uint64_t header_bytes = header_text.size();

  write_file_atomically(path, [&](std::ostream& out) {
    out.write(reinterpret_cast<const char*>(&header_bytes), 8);
    out.write(header_text.data(), static_cast<std::streamsize>(header_text.size()));
    for (const auto& data : contiguous) {
      out.write(static_cast<const char*>(data.data_ptr()),
                static_cast<std::streamsize>(data.numel() * data.element_size()));
    }
  });
}

}  // namespace qwen
