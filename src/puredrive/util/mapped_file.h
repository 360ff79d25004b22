// Read-only memory mapping of a whole file. Weights are used in place from the page cache.
//
// Live mappings are registered, so that code holding only a pointer into one (a weight view) can read the
// bytes with pread() instead of touching the mapping: a GPU upload that copies a 35B checkpoint through the
// mapping would fault every page into this process (resident memory as large as the model), where pread()
// copies from the page cache without mapping anything (read_weight_bytes()).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "puredrive/util/status.h"

namespace pd {

class MappedFile {
 public:
  static Expected<std::shared_ptr<MappedFile>> open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile() = default;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  int fd_ = -1;  // kept open for read_weight_bytes()
  std::string path_;
};

// How read_weight_bytes() reads bytes inside a live MappedFile: pread() from the file (the mapping's pages
// are never faulted in), or a copy through the mapping followed by MADV_DONTNEED on the pages it covered (for
// file systems where pread is slow; resident memory stays bounded either way).
enum class WeightRead { kPread, kMapped };
// kPread, or kMapped when the environment has PD_WEIGHT_READ=mmap.
WeightRead default_weight_read();

// Copies n bytes at src into dst. When [src, src + n) lies inside a live MappedFile they are read as `how`
// says; otherwise (ordinary memory) they are copied.
Status read_weight_bytes(void* dst, const void* src, size_t n, WeightRead how = default_weight_read());

// Whole file into a string (small text files: config.json, tokenizer.json).
Expected<std::string> read_text_file(const std::string& path);

}  // namespace pd
