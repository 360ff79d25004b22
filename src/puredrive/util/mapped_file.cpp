#include "puredrive/util/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace pd {

namespace {

// Opens a model file for reading. O_NONBLOCK keeps open() itself from waiting on a FIFO for a writer; only
// regular files are accepted, so a FIFO, a device or a directory in place of a model file is an error at
// once instead of a load that hangs or reads forever.
Expected<int> open_regular(const std::string& path, struct stat* st) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    return make_error(errno == ENOENT ? ErrorCode::kNotFound : ErrorCode::kIo, "{}: cannot open: {}", path,
                      std::strerror(errno));
  }
  if (::fstat(fd, st) != 0) {
    const int err = errno;
    ::close(fd);
    return make_error(ErrorCode::kIo, "{}: cannot stat: {}", path, std::strerror(err));
  }
  if (!S_ISREG(st->st_mode)) {
    ::close(fd);
    return make_error(ErrorCode::kInvalidArgument, "{}: not a regular file", path);
  }
  return fd;
}

}  // namespace

Expected<std::shared_ptr<MappedFile>> MappedFile::open(const std::string& path) {
  struct stat st {};
  PD_ASSIGN_OR_RETURN(const int fd, open_regular(path, &st));
  std::shared_ptr<MappedFile> f(new MappedFile());
  f->path_ = path;
  f->size_ = static_cast<size_t>(st.st_size);
  if (f->size_ > 0) {
    void* p = ::mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return make_error(ErrorCode::kIo, "{}: mmap failed: {}", path, std::strerror(err));
    }
    f->data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
  return f;
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
}

Expected<std::string> read_text_file(const std::string& path) {
  struct stat st {};
  PD_ASSIGN_OR_RETURN(const int fd, open_regular(path, &st));
  std::string text(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::read(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : 0;
      ::close(fd);
      return make_error(ErrorCode::kIo, "{}: read failed{}", path,
                        err ? std::string(": ") + std::strerror(err) : " (file shrank while read)");
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  return text;
}

}  // namespace pd
