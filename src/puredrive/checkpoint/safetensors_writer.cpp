#include "puredrive/checkpoint/safetensors_writer.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>

namespace pd {

std::vector<uint8_t> encode_floats(const std::vector<float>& v, DType dtype) {
  PD_ASSERT(dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16, "dtype {}",
            dtype_name(dtype));
  std::vector<uint8_t> out(v.size() * dtype_size(dtype));
  for (size_t i = 0; i < v.size(); ++i) {
    if (dtype == DType::kF32) {
      std::memcpy(out.data() + 4 * i, &v[i], 4);
    } else {
      const uint16_t h = dtype == DType::kBF16 ? f32_to_bf16(v[i]) : f32_to_f16(v[i]);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

Status SafetensorsWriter::add(const std::string& name, DType dtype, std::vector<int64_t> shape,
                              std::vector<uint8_t> bytes) {
  if (name.empty() || name == "__metadata__") {
    return make_error(ErrorCode::kInvalidArgument, "safetensors writer: invalid tensor name '{}'", name);
  }
  if (contains(name))
    return make_error(ErrorCode::kInvalidArgument, "safetensors writer: duplicate tensor '{}'", name);
  int64_t numel = 1;
  for (int64_t d : shape) {
    if (d < 0)
      return make_error(ErrorCode::kInvalidArgument, "safetensors writer: '{}' has a negative dim", name);
    numel *= d;
  }
  const uint64_t want = static_cast<uint64_t>(numel) * dtype_size(dtype);
  if (bytes.size() != want) {
    return make_error(ErrorCode::kInvalidArgument,
                      "safetensors writer: '{}' has {} bytes, shape [{}] x {} needs {}", name, bytes.size(),
                      fmt::join(shape, ", "), dtype_name(dtype), want);
  }
  names_.insert(name);
  entries_.push_back(Entry{name, dtype, std::move(shape), std::move(bytes)});
  return Status::ok();
}

Status SafetensorsWriter::add(const std::string& name, DType dtype, std::vector<int64_t> shape,
                              const void* data, size_t nbytes) {
  const auto* p = static_cast<const uint8_t*>(data);
  return add(name, dtype, std::move(shape), std::vector<uint8_t>(p, p + nbytes));
}

Status SafetensorsWriter::add_f32(const std::string& name, DType dtype, std::vector<int64_t> shape,
                                  const std::vector<float>& v) {
  return add(name, dtype, std::move(shape), encode_floats(v, dtype));
}

bool SafetensorsWriter::contains(const std::string& name) const {
  return names_.count(name) > 0;
}

std::vector<const SafetensorsWriter::Entry*> SafetensorsWriter::layout() const {
  std::vector<const Entry*> order;
  for (const auto& e : entries_) order.push_back(&e);
  std::stable_sort(order.begin(), order.end(), [](const Entry* a, const Entry* b) {
    return dtype_size(a->dtype) > dtype_size(b->dtype);
  });
  return order;
}

std::string SafetensorsWriter::header(const std::vector<const Entry*>& order) const {
  nlohmann::json j = nlohmann::json::object();
  if (!metadata_.empty()) j["__metadata__"] = metadata_;
  uint64_t offset = 0;
  for (const Entry* e : order) {
    j[e->name] = {{"dtype", dtype_name(e->dtype)},
                  {"shape", e->shape},
                  {"data_offsets", {offset, offset + e->bytes.size()}}};
    offset += e->bytes.size();
  }
  std::string h = j.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // padding keeps the data region 8-byte aligned
  std::string out;
  const uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  return out + h;
}

std::string SafetensorsWriter::serialize() const {
  const auto order = layout();
  std::string out = header(order);
  for (const Entry* e : order) out.append(reinterpret_cast<const char*>(e->bytes.data()), e->bytes.size());
  return out;
}

Status SafetensorsWriter::write(const std::string& path) const {
  const auto order = layout();
  const std::string h = header(order);
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) return make_error(ErrorCode::kIo, "{}: cannot create", path);
  f.write(h.data(), static_cast<std::streamsize>(h.size()));
  for (const Entry* e : order) {
    f.write(reinterpret_cast<const char*>(e->bytes.data()), static_cast<std::streamsize>(e->bytes.size()));
  }
  f.close();
  if (!f) return make_error(ErrorCode::kIo, "{}: write failed", path);
  return Status::ok();
}

}  // namespace pd
