#include "puredrive/checkpoint/sharded_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace pd {
namespace {

namespace fs = std::filesystem;

}  // namespace

PlannedTensor planned_tensor(std::string name, DType dtype, std::vector<int64_t> shape) {
  PlannedTensor t;
  t.name = std::move(name);
  t.dtype = dtype;
  t.shape = std::move(shape);
  uint64_t n = dtype_size(dtype);
  for (int64_t d : t.shape) n *= static_cast<uint64_t>(d);
  t.nbytes = n;
  return t;
}

Status pwrite_all(int fd, const void* data, size_t n, uint64_t offset, const std::string& path) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, n, static_cast<off_t>(offset));
    if (w < 0) {
      if (errno == EINTR) continue;
      return make_error(ErrorCode::kIo, "{}: write failed: {}", path, std::strerror(errno));
    }
    p += w;
    n -= static_cast<size_t>(w);
    offset += static_cast<uint64_t>(w);
  }
  return Status::ok();
}

Expected<std::unique_ptr<ShardedWriter>> ShardedWriter::create(const std::string& dir,
                                                               std::vector<PlannedTensor> tensors,
                                                               const std::vector<std::vector<size_t>>& groups,
                                                               const ShardingOptions& options) {
  std::unique_ptr<ShardedWriter> w(new ShardedWriter());
  w->dir_ = dir;
  w->options_ = options;
  w->tensors_ = std::move(tensors);
  w->placement_.resize(w->tensors_.size());
  std::vector<int> seen(w->tensors_.size(), 0);
  std::vector<std::vector<size_t>> shards;
  uint64_t cur = 0;
  for (const auto& g : groups) {
    uint64_t bytes = 0;
    for (size_t i : g) {
      if (i >= w->tensors_.size() || seen[i]++ != 0) {
        return make_error(ErrorCode::kInternal, "sharded writer: tensor index {} repeated or out of range",
                          i);
      }
      bytes += w->tensors_[i].nbytes;
    }
    if (shards.empty() || (cur > 0 && cur + bytes > options.max_shard_bytes)) {
      shards.emplace_back();
      cur = 0;
    }
    shards.back().insert(shards.back().end(), g.begin(), g.end());
    cur += bytes;
  }
  if (std::count(seen.begin(), seen.end(), 0) != 0) {
    return make_error(ErrorCode::kInternal, "sharded writer: a tensor is in no group");
  }
  const size_t n = shards.size();
  std::vector<std::string> headers;
  for (size_t s = 0; s < n; ++s) {
    w->files_.push_back(n == 1 ? options.single : fmt::format(fmt::runtime(options.pattern), s + 1, n));
    auto& order = shards[s];
    // Decreasing element size keeps every tensor aligned to its element without gaps between tensors.
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return dtype_size(w->tensors_[a].dtype) > dtype_size(w->tensors_[b].dtype);
    });
    nlohmann::json h = nlohmann::json::object();
    if (!options.metadata.empty()) h["__metadata__"] = options.metadata;
    uint64_t off = 0;
    for (size_t i : order) {
      const auto& t = w->tensors_[i];
      h[t.name] = {
          {"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {off, off + t.nbytes}}};
      w->placement_[i] = {s, off};
      off += t.nbytes;
    }
    std::string text = h.dump();
    text.append((8 - text.size() % 8) % 8, ' ');
    std::string header;
    const uint64_t len = text.size();
    for (int k = 0; k < 8; ++k) header.push_back(static_cast<char>((len >> (8 * k)) & 0xff));
    header += text;
    for (size_t i : order) w->placement_[i].offset += header.size();
    w->sizes_.push_back(header.size() + off);
    headers.push_back(std::move(header));
  }

  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return make_error(ErrorCode::kIo, "{}: cannot create: {}", dir, ec.message());
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.ends_with(".safetensors") || name == "model.safetensors.index.json") fs::remove(e.path(), ec);
  }
  for (size_t s = 0; s < n; ++s) {
    w->paths_.push_back((fs::path(dir) / w->files_[s]).string());
    const int fd = ::open(w->paths_.back().c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
      return make_error(ErrorCode::kIo, "{}: cannot create: {}", w->paths_.back(), std::strerror(errno));
    }
    w->fds_.push_back(fd);
    PD_TRY(pwrite_all(fd, headers[s].data(), headers[s].size(), 0, w->paths_.back()));
    if (::ftruncate(fd, static_cast<off_t>(w->sizes_[s])) != 0) {
      return make_error(ErrorCode::kIo, "{}: cannot size to {} bytes: {}", w->paths_.back(), w->sizes_[s],
                        std::strerror(errno));
    }
  }
  return w;
}

ShardedWriter::~ShardedWriter() {
  for (int fd : fds_) ::close(fd);
}

Status ShardedWriter::write(size_t tensor, uint64_t offset, const void* data, size_t n) {
  if (tensor >= tensors_.size() || offset + n > tensors_[tensor].nbytes) {
    return make_error(ErrorCode::kInternal, "sharded writer: bytes [{}, {}) outside tensor {}", offset,
                      offset + n, tensor < tensors_.size() ? tensors_[tensor].name : std::to_string(tensor));
  }
  const Placement& p = placement_[tensor];
  return pwrite_all(fds_[p.shard], data, n, p.offset + offset, paths_[p.shard]);
}

Status ShardedWriter::finish(bool sync) {
  Status first;
  for (size_t s = 0; s < fds_.size(); ++s) {
    if (sync && ::fsync(fds_[s]) != 0 && first.is_ok()) {
      first = make_error(ErrorCode::kIo, "{}: fsync failed: {}", paths_[s], std::strerror(errno));
    }
    ::close(fds_[s]);
  }
  fds_.clear();
  PD_TRY(first);
  if (files_.size() == 1 && !options_.index_when_single) return Status::ok();
  nlohmann::json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", nlohmann::json::object()}};
  uint64_t total = 0;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    index["weight_map"][tensors_[i].name] = files_[placement_[i].shard];
    total += tensors_[i].nbytes;
  }
  index["metadata"]["total_size"] = total;
  const fs::path path = fs::path(dir_) / "model.safetensors.index.json";
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << index.dump(4) << "\n";
  f.close();
  if (!f) return make_error(ErrorCode::kIo, "{}: write failed", path.string());
  return Status::ok();
}

uint64_t ShardedWriter::file_bytes() const {
  uint64_t n = 0;
  for (uint64_t s : sizes_) n += s;
  return n;
}

}  // namespace pd
