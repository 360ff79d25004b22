// Streams a checkpoint to disk as safetensors shards written in place: the layout (names, shapes, offsets,
// shard boundaries) is fixed first and the files sized, then any thread writes any tensor's bytes at their
// offset, so a checkpoint of any size is written with only the callers' buffers in memory. `puredrive
// quantize` and `puredrive synth --write` write through it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "puredrive/util/dtype.h"
#include "puredrive/util/status.h"

namespace pd {

struct PlannedTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t nbytes = 0;  // numel * dtype size
};

PlannedTensor planned_tensor(std::string name, DType dtype, std::vector<int64_t> shape);

struct ShardingOptions {
  uint64_t max_shard_bytes = 5ull << 30;
  // Shard file names: fmt pattern of (index from 1, count); a checkpoint that fits in one file is `single`.
  std::string pattern = "model-{:05d}-of-{:05d}.safetensors";
  std::string single = "model.safetensors";
  // model.safetensors.index.json also for a single file (mlx-lm writes it always, transformers only for
  // sharded checkpoints).
  bool index_when_single = true;
  std::map<std::string, std::string> metadata = {{"format", "mlx"}};
};

class ShardedWriter {
 public:
  // groups: tensor indices that must share a shard (a quantized module's weight, scales and biases), in file
  // order; every tensor in exactly one group. Existing *.safetensors files and the index in `dir` are removed
  // first, since a later open of the directory would pick them up.
  static Expected<std::unique_ptr<ShardedWriter>> create(const std::string& dir,
                                                         std::vector<PlannedTensor> tensors,
                                                         const std::vector<std::vector<size_t>>& groups,
                                                         const ShardingOptions& options);
  ~ShardedWriter();
  ShardedWriter(const ShardedWriter&) = delete;
  ShardedWriter& operator=(const ShardedWriter&) = delete;

  // Bytes [offset, offset + n) of tensor `tensor`; thread-safe, any order.
  Status write(size_t tensor, uint64_t offset, const void* data, size_t n);
  // fsync (when `sync`), close, and write model.safetensors.index.json.
  Status finish(bool sync = true);

  const std::vector<PlannedTensor>& tensors() const { return tensors_; }
  const std::vector<std::string>& files() const { return files_; }  // names relative to the directory
  uint64_t file_bytes() const;                                      // headers included

 private:
  ShardedWriter() = default;
  struct Placement {
    size_t shard = 0;
    uint64_t offset = 0;  // absolute file offset
  };
  std::string dir_;
  ShardingOptions options_;
  std::vector<PlannedTensor> tensors_;
  std::vector<Placement> placement_;
  std::vector<std::string> files_;
  std::vector<std::string> paths_;
  std::vector<uint64_t> sizes_;
  std::vector<int> fds_;
};

// pwrite() of all n bytes (retrying short writes and EINTR).
Status pwrite_all(int fd, const void* data, size_t n, uint64_t offset, const std::string& path);

}  // namespace pd
