// Read-only memory mapping of a whole file. Weights are used in place from the page cache.
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
  std::string path_;
};

// Whole file into a string (small text files: config.json, tokenizer.json).
Expected<std::string> read_text_file(const std::string& path);

}  // namespace pd
