// Reading safetensors through mmap, with the header checked field by field; writing them atomically.
#include "qwen_gsm8k/model/safetensors.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <ostream>
#include <set>
#include <stdexcept>

#include "qwen_gsm8k/common/atomic_file.hpp"
#include "qwen_gsm8k/model/safetensors_header.hpp"

namespace qwen {
namespace {

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

torch::ScalarType dtype_of(const std::string& name) {
  for (const auto& known : kDtypes) {
    if (name == known.name) return known.dtype;
  }
  throw std::logic_error("safetensors dtype " + name + " has no LibTorch dtype");  // parse_safetensors_header checked
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
  if (file.size_ == 0) {  // mmap refuses an empty file; the header parser names the problem
    ::close(fd);
    parse_safetensors_header({}, path.string());
  }
  void* mapping = ::mmap(nullptr, file.size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (mapping == MAP_FAILED) fail(path, std::string("cannot mmap: ") + std::strerror(errno));
  file.mapping_ = static_cast<const std::byte*>(mapping);

  SafetensorsHeader header = parse_safetensors_header({file.mapping_, file.size_}, path.string());
  file.data_start_ = header.data_start;
  file.metadata_ = std::move(header.metadata);
  for (auto& entry : header.entries) {
    const torch::ScalarType dtype = dtype_of(entry.dtype_name);
    file.entries_.push_back(
        {std::move(entry.name), std::move(entry.dtype_name), dtype, std::move(entry.shape), entry.begin, entry.end});
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
