// safetensors reader: one file or a sharded set (model.safetensors.index.json), memory-mapped, every header
// field validated before any tensor is handed out. Format: 8-byte little-endian header length N, N bytes of
// JSON {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}, then the data region;
// offsets are relative to the start of the data region (https://github.com/huggingface/safetensors).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "puredrive/util/dtype.h"
#include "puredrive/util/mapped_file.h"
#include "puredrive/util/status.h"

namespace pd {

// Headers beyond this are refused: real checkpoints stay under a few MB even with 10^5 tensors.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100ull << 20;

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // into the mapping of `file`
  uint64_t nbytes = 0;
  std::string file;  // path of the safetensors file holding it

  int64_t numel() const;
  std::string shape_string() const;  // "[8192, 1, 4]"
};

// One parsed safetensors file. Keeps its mapping alive; TensorInfo::data points into it.
class SafetensorsFile {
 public:
  static Expected<SafetensorsFile> open(const std::string& path);
  // Parses an in-memory image; `mapping` (may be null) is kept alive by the result.
  static Expected<SafetensorsFile> parse(const uint8_t* bytes, size_t size, const std::string& source,
                                         std::shared_ptr<const void> mapping);

  const std::string& path() const { return path_; }
  // Tensors in data-offset order.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::shared_ptr<const void>& mapping() const { return mapping_; }

 private:
  std::string path_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
  std::shared_ptr<const void> mapping_;
};

// All tensors of a checkpoint directory, possibly spread over shards.
class TensorStore {
 public:
  // Opens `dir`: model.safetensors.index.json if present, else model.safetensors, else the only *.safetensors
  // file. kNotFound when the directory has no weights at all (config-only directories).
  static Expected<TensorStore> open_dir(const std::string& dir);
  // Opens the given files as one checkpoint (names must be unique across them).
  static Expected<TensorStore> open_files(const std::vector<std::string>& paths);
  // Names, dtypes and shapes without files (data null): a checkpoint that is about to be written, for code
  // that only plans from the listing (plan_quantization). Names must be unique.
  static Expected<TensorStore> listing(std::vector<TensorInfo> tensors);

  const TensorInfo* find(const std::string& name) const;
  // Every tensor, shard by shard in data-offset order.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const std::vector<SafetensorsFile>& files() const { return files_; }
  uint64_t total_bytes() const;

 private:
  Status add_file(SafetensorsFile file);
  std::vector<SafetensorsFile> files_;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, size_t> index_;
};

// Lists the weight files of a checkpoint directory (see TensorStore::open_dir) and, for a sharded one,
// validates the index: every shard it names exists. kNotFound when there are none.
Expected<std::vector<std::string>> find_weight_files(const std::string& dir);

}  // namespace pd
