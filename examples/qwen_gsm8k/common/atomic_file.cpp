// write_file_atomically: one temporary beside the target, removed on every failure after it was created. The bytes go
// through a stream buffer over the file descriptor, so that a failed write keeps its errno (EFBIG, ENOSPC, EIO) for
// the message; std::ofstream loses it.
#include "qwen_gsm8k/common/atomic_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <streambuf>
#include <string>
#include <system_error>
#include <vector>

namespace qwen {
namespace {

namespace fs = std::filesystem;

void remove_quietly(const fs::path& path) {
  std::error_code ignored;
  fs::remove(path, ignored);
}

// Writes to a file descriptor. The first failed write is remembered (error()) and everything after it is dropped
// while the stream is told that all went well: a writer that cannot take a failing stream (LibTorch's archive writer
// throws from inside its destructor) still returns, and write_file_atomically then reports the errno.
class DescriptorBuffer : public std::streambuf {
 public:
  explicit DescriptorBuffer(int fd) : fd_(fd), buffer_(1 << 16) {
    setp(buffer_.data(), buffer_.data() + buffer_.size());
  }
  // The errno of the first failed write; 0 while none failed.
  int error() const { return error_; }

 protected:
  int_type overflow(int_type ch) override {
    drain();
    if (!traits_type::eq_int_type(ch, traits_type::eof())) {
      *pptr() = traits_type::to_char_type(ch);
      pbump(1);
    }
    return traits_type::not_eof(ch);
  }
  std::streamsize xsputn(const char* data, std::streamsize count) override {
    if (count < static_cast<std::streamsize>(buffer_.size())) return std::streambuf::xsputn(data, count);
    drain();  // a large piece (a tensor) goes straight to the file
    write_all(data, static_cast<std::size_t>(count));
    return count;
  }
  int sync() override {
    drain();
    return 0;
  }

 private:
  void drain() {
    write_all(pbase(), static_cast<std::size_t>(pptr() - pbase()));
    setp(buffer_.data(), buffer_.data() + buffer_.size());
  }
  void write_all(const char* data, std::size_t count) {
    while (count > 0 && error_ == 0) {
      const ssize_t written = ::write(fd_, data, count);
      if (written < 0) {
        if (errno != EINTR) error_ = errno;
        continue;
      }
      if (written == 0) error_ = EIO;  // no progress: never loop on it
      data += written;
      count -= static_cast<std::size_t>(written);
    }
  }

  int fd_;
  std::vector<char> buffer_;
  int error_ = 0;
};

[[noreturn]] void fail_write(const fs::path& temporary, const std::string& what, int error) {
  throw std::runtime_error(temporary.string() + ": " + what + " (" + std::strerror(error) +
                           "; disk full, or a file size limit such as ulimit -f?)");
}

}  // namespace

void write_file_atomically(const fs::path& path, const std::function<void(std::ostream&)>& write) {
  fs::path temporary = path;
  temporary += ".tmp";
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd < 0) {
    throw std::runtime_error(temporary.string() + ": cannot open for writing: " + std::strerror(errno) +
                             " (does the directory exist, and is it writable?)");
  }
  try {
    DescriptorBuffer buffer(fd);
    std::ostream out(&buffer);
    write(out);
    out.flush();
    if (buffer.error() != 0) fail_write(temporary, "write failed", buffer.error());
    if (!out) throw std::runtime_error(temporary.string() + ": write failed (disk full?)");
    // Only fsync reports what the kernel could not write back (ENOSPC, EIO on delayed allocation or a network file
    // system); file systems that cannot sync a regular file say EINVAL, which is not a failure of this write.
    if (::fsync(fd) != 0 && errno != EINVAL) fail_write(temporary, "cannot flush to disk", errno);
  } catch (...) {
    ::close(fd);
    remove_quietly(temporary);
    throw;
  }
  if (::close(fd) != 0) {
    const int error = errno;
    remove_quietly(temporary);
    fail_write(temporary, "cannot close", error);
  }
  std::error_code error;
  fs::rename(temporary, path, error);
  if (error) {
    remove_quietly(temporary);
    throw std::runtime_error(path.string() + ": cannot move " + temporary.filename().string() +
                             " into place: " + error.message() + " (is there a directory of that name?)");
  }
}

void write_file_atomically(const fs::path& path, std::string_view text) {
  write_file_atomically(
      path, [text](std::ostream& out) { out.write(text.data(), static_cast<std::streamsize>(text.size())); });
}

}  // namespace qwen
