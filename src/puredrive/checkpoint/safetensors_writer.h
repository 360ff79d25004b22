// A small safetensors writer: tests build synthetic checkpoints with it, and `puredrive synth` / `quantize`
// write their outputs through it. Tensors are laid out by decreasing element size so that every tensor starts
// at a multiple of its own element size (the header is padded to 8 bytes), with no gaps between tensors.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "puredrive/util/dtype.h"
#include "puredrive/util/status.h"

namespace pd {

class SafetensorsWriter {
 public:
  // Adds a tensor; `bytes` must hold exactly numel(shape) * dtype_size(dtype) bytes.
  Status add(const std::string& name, DType dtype, std::vector<int64_t> shape, std::vector<uint8_t> bytes);
  Status add(const std::string& name, DType dtype, std::vector<int64_t> shape, const void* data,
             size_t nbytes);
  // Convenience: f32 values stored as F32, BF16 or F16 (rounded to nearest even).
  Status add_f32(const std::string& name, DType dtype, std::vector<int64_t> shape,
                 const std::vector<float>& v);
  void set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }

  bool contains(const std::string& name) const;
  // The whole file image.
  std::string serialize() const;
  Status write(const std::string& path) const;

 private:
  struct Entry {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
  };
  std::vector<const Entry*> layout() const;
  std::string header(const std::vector<const Entry*>& order) const;  // length prefix + padded JSON

  std::vector<Entry> entries_;
  std::set<std::string> names_;
  std::map<std::string, std::string> metadata_;
};

// Bytes of `v` converted to `dtype` (F32, BF16 or F16), little-endian.
std::vector<uint8_t> encode_floats(const std::vector<float>& v, DType dtype);

}  // namespace pd
