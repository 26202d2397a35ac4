// The ZIP structures as PKWARE's APPNOTE.TXT lays them out (little-endian): the end of central directory record
// (4.3.16), the ZIP64 locator and record (4.3.14, 4.3.15), central directory headers (4.3.12), local file headers
// (4.3.7) and the ZIP64 extra field (4.5.3); every offset checked against the file before it is read.
#include "qwen_gsm8k/common/zip_check.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>

namespace qwen {
namespace {

constexpr uint32_t kEndSignature = 0x06054b50;
constexpr uint32_t kZip64LocatorSignature = 0x07064b50;
constexpr uint32_t kZip64EndSignature = 0x06064b50;
constexpr uint32_t kCentralSignature = 0x02014b50;
constexpr uint32_t kLocalSignature = 0x04034b50;
constexpr uint64_t kEndBytes = 22, kLocatorBytes = 20, kCentralBytes = 46, kLocalBytes = 30;
constexpr uint16_t kStored = 0;      // compression method 0: the bytes as they are (what LibTorch writes)
constexpr uint16_t kZip64Extra = 1;  // extra field id of the 64-bit sizes and offset

// CRC-32 (ISO-HDLC, the polynomial 0xEDB88320 reflected), eight bytes per step ("slicing by 8"): a 12 GB optimizer
// state is checked in seconds.
using Crc32Tables = std::array<std::array<uint32_t, 256>, 8>;
constexpr Crc32Tables make_crc32_tables() {
  Crc32Tables tables{};
  for (uint32_t byte = 0; byte < 256; ++byte) {
    uint32_t crc = byte;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
    tables[0][byte] = crc;
  }
  for (std::size_t slice = 1; slice < 8; ++slice) {
    for (std::size_t byte = 0; byte < 256; ++byte) {
      const uint32_t previous = tables[slice - 1][byte];
      tables[slice][byte] = (previous >> 8) ^ tables[0][previous & 0xFF];
    }
  }
  return tables;
}
constexpr Crc32Tables kCrc32 = make_crc32_tables();

uint32_t load32(const std::byte* at) {
  return static_cast<uint32_t>(at[0]) | static_cast<uint32_t>(at[1]) << 8 | static_cast<uint32_t>(at[2]) << 16 |
         static_cast<uint32_t>(at[3]) << 24;
}

uint32_t crc32(std::span<const std::byte> data) {
  uint32_t crc = 0xFFFFFFFFu;
  const std::byte* at = data.data();
  std::size_t left = data.size();
  for (; left >= 8; at += 8, left -= 8) {
    const uint32_t low = load32(at) ^ crc, high = load32(at + 4);
    crc = kCrc32[7][low & 0xFF] ^ kCrc32[6][(low >> 8) & 0xFF] ^ kCrc32[5][(low >> 16) & 0xFF] ^ kCrc32[4][low >> 24] ^
          kCrc32[3][high & 0xFF] ^ kCrc32[2][(high >> 8) & 0xFF] ^ kCrc32[1][(high >> 16) & 0xFF] ^
          kCrc32[0][high >> 24];
  }
  for (; left > 0; ++at, --left) crc = (crc >> 8) ^ kCrc32[0][(crc ^ static_cast<uint32_t>(*at)) & 0xFF];
  return ~crc;
}

std::string hex(uint64_t value) {
  char text[24];
  std::snprintf(text, sizeof text, "0x%08llx", static_cast<unsigned long long>(value));
  return text;
}

// Little-endian fields of the archive, each read only after its range was checked; a range outside the file throws
// the problem (caught in zip_archive_problem).
class Archive {
 public:
  explicit Archive(std::span<const std::byte> bytes) : bytes_(bytes) {}
  uint64_t size() const { return bytes_.size(); }

  void require(uint64_t offset, uint64_t length, const std::string& what) const {
    if (offset > size() || length > size() - offset) {
      throw std::runtime_error(what + " (bytes " + std::to_string(offset) + ".." + std::to_string(offset + length) +
                               ") lies beyond the end of the file, " + std::to_string(size()) + " bytes: truncated?");
    }
  }
  uint64_t field(uint64_t offset, int bytes, const std::string& what) const {
    require(offset, static_cast<uint64_t>(bytes), what);
    uint64_t value = 0;
    for (int i = bytes - 1; i >= 0; --i) value = value << 8 | static_cast<uint64_t>(bytes_[offset + i]);
    return value;
  }
  void expect_signature(uint64_t offset, uint32_t signature, const std::string& what) const {
    const uint64_t found = field(offset, 4, what);
    if (found != signature) {
      throw std::runtime_error(what + " at byte " + std::to_string(offset) + " has signature " + hex(found) +
                               " instead of " + hex(signature));
    }
  }
  std::span<const std::byte> range(uint64_t offset, uint64_t length, const std::string& what) const {
    require(offset, length, what);
    return bytes_.subspan(offset, length);
  }
  // An entry's name for a message: printable ASCII kept, other bytes shown as '?', long names cut.
  std::string name(uint64_t offset, uint64_t length) const {
    std::string text;
    for (const std::byte byte : range(offset, length, "an entry name")) {
      const auto c = static_cast<unsigned char>(byte);
      text += c >= 0x20 && c < 0x7F ? static_cast<char>(c) : '?';
      if (text.size() == 80) return text + "...";
    }
    return text;
  }

 private:
  std::span<const std::byte> bytes_;
};

// The end of central directory record: the last one whose comment reaches exactly the end of the file.
uint64_t find_end_record(const Archive& archive) {
  if (archive.size() < kEndBytes) {
    throw std::runtime_error("is " + std::to_string(archive.size()) +
                             " bytes, too short for a ZIP archive's end record (truncated?)");
  }
  const uint64_t lowest = archive.size() > kEndBytes + 0xFFFF ? archive.size() - kEndBytes - 0xFFFF : 0;
  for (uint64_t at = archive.size() - kEndBytes + 1; at-- > lowest;) {
    if (archive.field(at, 4, "the end record") == kEndSignature &&
        at + kEndBytes + archive.field(at + 20, 2, "the end record's comment length") == archive.size()) {
      return at;
    }
  }
  throw std::runtime_error("has no ZIP end of central directory record (truncated, or its end overwritten?)");
}

void check_archive(const Archive& archive) {
  const uint64_t end = find_end_record(archive);
  uint64_t entries = archive.field(end + 10, 2, "the end record");
  uint64_t directory_bytes = archive.field(end + 12, 4, "the end record");
  uint64_t directory = archive.field(end + 16, 4, "the end record");
  if (entries == 0xFFFF || directory_bytes == 0xFFFFFFFF || directory == 0xFFFFFFFF) {  // ZIP64: > 4 GB
    if (end < kLocatorBytes) throw std::runtime_error("has no room for the ZIP64 locator before its end record");
    const uint64_t locator = end - kLocatorBytes;
    archive.expect_signature(locator, kZip64LocatorSignature, "the ZIP64 locator");
    const uint64_t record = archive.field(locator + 8, 8, "the ZIP64 locator");
    archive.expect_signature(record, kZip64EndSignature, "the ZIP64 end record");
    entries = archive.field(record + 32, 8, "the ZIP64 end record");
    directory_bytes = archive.field(record + 40, 8, "the ZIP64 end record");
    directory = archive.field(record + 48, 8, "the ZIP64 end record");
  }
  archive.require(directory, directory_bytes, "the central directory");
  uint64_t at = directory;
  uint64_t all_data = 0;  // entries' data never overlap: this bounds the bytes checked to the file's size
  for (uint64_t index = 0; index < entries; ++index) {
    const std::string where = "central directory entry " + std::to_string(index);
    archive.expect_signature(at, kCentralSignature, where);
    archive.require(at, kCentralBytes, where);
    const auto method = static_cast<uint16_t>(archive.field(at + 10, 2, where));
    const uint64_t stored_crc = archive.field(at + 16, 4, where);
    uint64_t data_bytes = archive.field(at + 20, 4, where);
    uint64_t size = archive.field(at + 24, 4, where);
    const uint64_t name_bytes = archive.field(at + 28, 2, where);
    const uint64_t extra_bytes = archive.field(at + 30, 2, where);
    const uint64_t comment_bytes = archive.field(at + 32, 2, where);
    uint64_t local = archive.field(at + 42, 4, where);
    const std::string entry = "entry \"" + archive.name(at + kCentralBytes, name_bytes) + "\"";
    // The ZIP64 extra field holds, in this order, the fields whose 32-bit value is all ones.
    for (uint64_t extra = at + kCentralBytes + name_bytes, extra_end = extra + extra_bytes; extra + 4 <= extra_end;) {
      const uint64_t id = archive.field(extra, 2, entry + "'s extra field");
      const uint64_t length = archive.field(extra + 2, 2, entry + "'s extra field");
      if (id == kZip64Extra) {
        uint64_t field = extra + 4;
        for (uint64_t* value : {&size, &data_bytes, &local}) {
          if (*value != 0xFFFFFFFF) continue;
          *value = archive.field(field, 8, entry + "'s ZIP64 field");
          field += 8;
        }
      }
      extra += 4 + length;
    }
    archive.expect_signature(local, kLocalSignature, entry + "'s local header");
    const uint64_t data = local + kLocalBytes + archive.field(local + 26, 2, entry + "'s local header") +
                          archive.field(local + 28, 2, entry + "'s local header");
    const auto bytes = archive.range(data, data_bytes, entry + "'s data");
    all_data += data_bytes;
    if (all_data > archive.size()) {
      throw std::runtime_error(entry + "'s data overlaps other entries' (together more bytes than the file has)");
    }
    if (method == kStored) {
      if (data_bytes != size) {
        throw std::runtime_error(entry + " is stored with " + std::to_string(data_bytes) + " bytes but says it has " +
                                 std::to_string(size));
      }
      const uint32_t computed = crc32(bytes);
      if (computed != stored_crc) {
        throw std::runtime_error(entry + " (" + std::to_string(data_bytes) + " bytes at byte " + std::to_string(data) +
                                 ") fails its CRC-32 check: recorded " + hex(stored_crc) + ", computed " +
                                 hex(computed) + " (bytes overwritten?)");
      }
    }
    at += kCentralBytes + name_bytes + extra_bytes + comment_bytes;
  }
}

}  // namespace

std::optional<std::string> zip_archive_problem(std::span<const std::byte> archive) {
  try {
    check_archive(Archive(archive));
  } catch (const std::runtime_error& problem) {
    return problem.what();
  }
  return std::nullopt;
}

std::optional<std::string> zip_archive_problem(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::string("cannot open: ") + std::strerror(errno);
  struct stat status {};
  if (::fstat(fd, &status) != 0) {
    const int error = errno;
    ::close(fd);
    return std::string("cannot stat: ") + std::strerror(error);
  }
  const auto size = static_cast<std::size_t>(status.st_size);
  if (size == 0) {
    ::close(fd);
    return zip_archive_problem(std::span<const std::byte>());
  }
  void* mapping = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int error = errno;
  ::close(fd);
  if (mapping == MAP_FAILED) return std::string("cannot mmap: ") + std::strerror(error);
  ::madvise(mapping, size, MADV_SEQUENTIAL);
  auto problem = zip_archive_problem(std::span<const std::byte>(static_cast<const std::byte*>(mapping), size));
  ::munmap(mapping, size);
  return problem;
}

}  // namespace qwen
