#pragma once
/// \file step5/core/mapped_file.hpp
/// `MappedFile`: a read-only memory mapping of a whole regular file (POSIX), used by the
/// safetensors reader, the checkpoint index and the config loader. Host only (g++).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

#include "step5/core/status.hpp"

namespace step5 {

/// Read-only memory mapping of a whole file (POSIX). Move-only. An empty file maps to no
/// memory (`data() == nullptr`, `size() == 0`).
class MappedFile {
 public:
  MappedFile() = default;
  /// Maps `path`; throws `Error` (kNotFound when it does not exist, kIoError otherwise, also for
  /// anything but a regular file: a FIFO, a device such as /dev/zero, a directory).
  explicit MappedFile(const std::string& path) : path_(path) {
    // O_NONBLOCK: opening a FIFO would otherwise wait for a writer (forever); the regular-file
    // check below refuses it, and the flag means nothing for a regular file's mapping
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
      const int err = errno;
      throw Error(err == ENOENT ? StatusCode::kNotFound : StatusCode::kIoError,
                  "cannot open file '" + path + "': " + std::strerror(err));
    }
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      const int err = errno;
      ::close(fd);
      throw Error(StatusCode::kIoError, "cannot stat '" + path + "': " + std::strerror(err));
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd);
      const char* kind = S_ISDIR(st.st_mode) ? "a directory" : S_ISFIFO(st.st_mode) ? "a FIFO"
                         : S_ISCHR(st.st_mode) ? "a character device" : S_ISBLK(st.st_mode) ? "a block device"
                         : S_ISSOCK(st.st_mode) ? "a socket" : "not a regular file";
      throw Error(StatusCode::kIoError, "'" + path + "' is " + kind + ", expected a readable regular file");
    }
    size_ = static_cast<std::uint64_t>(st.st_size);
    if (size_ > 0) {
      void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        const int err = errno;
        ::close(fd);
        throw Error(StatusCode::kIoError, "cannot mmap '" + path + "': " + std::strerror(err));
      }
      data_ = static_cast<const std::uint8_t*>(p);
    }
    ::close(fd);
  }
  MappedFile(MappedFile&& o) noexcept { swap(o); }
  MappedFile& operator=(MappedFile&& o) noexcept {
    if (this != &o) {
      MappedFile tmp(std::move(o));
      swap(tmp);
    }
    return *this;
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile() {
    if (data_) ::munmap(const_cast<std::uint8_t*>(data_), size_);
  }
  const std::uint8_t* data() const { return data_; }
  std::uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  void swap(MappedFile& o) noexcept {
    std::swap(path_, o.path_);
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
  }
  std::string path_;
  const std::uint8_t* data_ = nullptr;
  std::uint64_t size_ = 0;
};

}  // namespace step5
