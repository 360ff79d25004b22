#include "puredrive/util/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

namespace pd {
namespace {

struct Registered {
  size_t size = 0;
  int fd = -1;
  const std::string* path = nullptr;
};

// Live mappings by start address.
std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
std::map<uintptr_t, Registered>& registry() {
  static std::map<uintptr_t, Registered> r;
  return r;
}

// Opens a model file for reading. O_NONBLOCK keeps open() itself from waiting on a FIFO for a writer (it
// changes nothing for regular files); only regular files are accepted, so a FIFO, a device or a directory in
// place of a model file is an error at once instead of a load that hangs or reads forever.
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
  f->fd_ = fd;
  if (f->size_ > 0) {
    void* p = ::mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      return make_error(ErrorCode::kIo, "{}: mmap failed: {}", path, std::strerror(err));
    }
    f->data_ = static_cast<const uint8_t*>(p);
    std::lock_guard<std::mutex> lock(registry_mutex());
    registry()[reinterpret_cast<uintptr_t>(f->data_)] = {f->size_, fd, &f->path_};
  }
  return f;
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) {
    {
      std::lock_guard<std::mutex> lock(registry_mutex());
      registry().erase(reinterpret_cast<uintptr_t>(data_));
    }
    ::munmap(const_cast<uint8_t*>(data_), size_);
  }
  if (fd_ >= 0) ::close(fd_);
}

WeightRead default_weight_read() {
  static const WeightRead mode = [] {
    const char* v = std::getenv("PD_WEIGHT_READ");
    return v != nullptr && std::strcmp(v, "mmap") == 0 ? WeightRead::kMapped : WeightRead::kPread;
  }();
  return mode;
}

Status read_weight_bytes(void* dst, const void* src, size_t n, WeightRead how) {
  const auto at = reinterpret_cast<uintptr_t>(src);
  Registered file;
  uintptr_t base = 0;
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    auto it = registry().upper_bound(at);
    if (it != registry().begin()) {
      --it;
      if (at - it->first + n <= it->second.size) {
        base = it->first;
        file = it->second;
      }
    }
  }
  if (file.fd < 0) {
    std::memcpy(dst, src, n);
    return Status::ok();
  }
  if (how == WeightRead::kMapped) {
    std::memcpy(dst, src, n);
    // The pages wholly inside the range leave this process (they stay in the page cache); the file is mapped
    // read-only and private, so nothing is lost.
    const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
    const uintptr_t begin = (at + page - 1) / page * page, end = (at + n) / page * page;
    if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
    return Status::ok();
  }
  auto* out = static_cast<uint8_t*>(dst);
  uint64_t offset = at - base;
  while (n > 0) {
    const ssize_t r = ::pread(file.fd, out, n, static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      return make_error(ErrorCode::kIo, "{}: read of {} bytes at offset {} failed: {}", *file.path, n, offset,
                        r == 0 ? "unexpected end of file" : std::strerror(errno));
    }
    out += r;
    n -= static_cast<size_t>(r);
    offset += static_cast<uint64_t>(r);
  }
  return Status::ok();
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
