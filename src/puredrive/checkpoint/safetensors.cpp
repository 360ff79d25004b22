#include "puredrive/checkpoint/safetensors.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>

#include "puredrive/util/log.h"

namespace pd {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

// Returns the offset of the first byte that breaks UTF-8 well-formedness (RFC 3629: no overlongs, no
// surrogates, nothing above U+10FFFF), or npos.
size_t find_invalid_utf8(const uint8_t* s, size_t n) {
  size_t i = 0;
  while (i < n) {
    const uint8_t c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    int len = 0;
    uint8_t lo = 0x80, hi = 0xbf;  // allowed range of the second byte
    if (c >= 0xc2 && c <= 0xdf) {
      len = 2;
    } else if (c >= 0xe0 && c <= 0xef) {
      len = 3;
      if (c == 0xe0) lo = 0xa0;
      if (c == 0xed) hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
      len = 4;
      if (c == 0xf0) lo = 0x90;
      if (c == 0xf4) hi = 0x8f;
    } else {
      return i;
    }
    if (i + static_cast<size_t>(len) > n) return i;
    if (s[i + 1] < lo || s[i + 1] > hi) return i;
    for (int k = 2; k < len; ++k) {
      if ((s[i + k] & 0xc0) != 0x80) return i;
    }
    i += static_cast<size_t>(len);
  }
  return std::string::npos;
}

std::string supported_dtypes() {
  return "F32, F16, BF16, U32, I32, U8, I8, I64, F8_E4M3, BOOL";
}

// Reads a non-negative integer that fits in int64.
bool as_nonneg_int(const json& v, int64_t* out) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
    *out = static_cast<int64_t>(u);
    return true;
  }
  if (v.is_number_integer()) {
    const int64_t i = v.get<int64_t>();
    if (i < 0) return false;
    *out = i;
    return true;
  }
  return false;
}

Status parse_entry(const std::string& src, const std::string& name, const json& e, uint64_t data_size,
                   TensorInfo* t, uint64_t* begin_out) {
  if (!e.is_object()) {
    return make_error(ErrorCode::kCorrupt, "{}: tensor '{}': header entry is {}, expected an object", src,
                      name, e.type_name());
  }
  auto dt = e.find("dtype");
  if (dt == e.end() || !dt->is_string()) {
    return make_error(ErrorCode::kCorrupt, "{}: tensor '{}': missing or non-string 'dtype'", src, name);
  }
  const auto dtype = dtype_from_safetensors(dt->get<std::string>());
  if (!dtype) {
    return make_error(ErrorCode::kUnsupported, "{}: tensor '{}': unknown dtype '{}' (supported: {})", src,
                      name, dt->get<std::string>(), supported_dtypes());
  }
  auto sh = e.find("shape");
  if (sh == e.end() || !sh->is_array()) {
    return make_error(ErrorCode::kCorrupt, "{}: tensor '{}': missing or non-array 'shape'", src, name);
  }
  auto off = e.find("data_offsets");
  if (off == e.end() || !off->is_array() || off->size() != 2) {
    return make_error(ErrorCode::kCorrupt, "{}: tensor '{}': 'data_offsets' must be an array [begin, end]",
                      src, name);
  }
  t->name = name;
  t->dtype = *dtype;
  t->file = src;
  // Element count with overflow detection: the product must stay below 2^63 / element size.
  const uint64_t limit = static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / dtype_size(*dtype);
  uint64_t numel = 1;
  for (const auto& d : *sh) {
    int64_t v = 0;
    if (!as_nonneg_int(d, &v)) {
      return make_error(ErrorCode::kCorrupt,
                        "{}: tensor '{}': shape entries must be non-negative integers, got {}", src, name,
                        sh->dump());
    }
    t->shape.push_back(v);
    if (v != 0 && numel > limit / static_cast<uint64_t>(v)) {
      return make_error(ErrorCode::kCorrupt, "{}: tensor '{}': shape {} overflows", src, name, sh->dump());
    }
    numel *= static_cast<uint64_t>(v);
  }
  int64_t begin = 0, end = 0;
  if (!as_nonneg_int((*off)[0], &begin) || !as_nonneg_int((*off)[1], &end)) {
    return make_error(ErrorCode::kCorrupt, "{}: tensor '{}': data_offsets {} must be non-negative integers",
                      src, name, off->dump());
  }
  if (begin > end) {
    return make_error(ErrorCode::kCorrupt, "{}: tensor '{}': data_offsets [{}, {}] begin after end", src,
                      name, begin, end);
  }
  const uint64_t expected = numel * dtype_size(*dtype);
  const uint64_t span = static_cast<uint64_t>(end - begin);
  if (span != expected) {
    return make_error(
        ErrorCode::kCorrupt,
        "{}: tensor '{}': byte span {} (data_offsets [{}, {}]) does not match shape {} x {} ({} bytes)", src,
        name, span, begin, end, t->shape_string(), dtype_name(*dtype), expected);
  }
  if (static_cast<uint64_t>(end) > data_size) {
    return make_error(
        ErrorCode::kCorrupt,
        "{}: tensor '{}': data_offsets [{}, {}] lie outside the data region ({} bytes); the file is "
        "truncated or the header is wrong",
        src, name, begin, end, data_size);
  }
  t->nbytes = expected;
  *begin_out = static_cast<uint64_t>(begin);
  return Status::ok();
}

}  // namespace

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string TensorInfo::shape_string() const {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

Expected<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  PD_ASSIGN_OR_RETURN(auto mapped, MappedFile::open(path));
  const uint8_t* bytes = mapped->data();
  const size_t size = mapped->size();
  return parse(bytes, size, path, std::move(mapped));
}

Expected<SafetensorsFile> SafetensorsFile::parse(const uint8_t* bytes, size_t size, const std::string& src,
                                                 std::shared_ptr<const void> mapping) {
  if (size < 8) {
    return make_error(ErrorCode::kCorrupt,
                      "{}: file is {} bytes, shorter than the 8-byte safetensors header length", src, size);
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[i];  // little-endian regardless of host
  if (n > kMaxSafetensorsHeaderBytes) {
    return make_error(ErrorCode::kCorrupt,
                      "{}: header length {} exceeds the {} MB limit; not a safetensors file?", src, n,
                      kMaxSafetensorsHeaderBytes >> 20);
  }
  if (n > size - 8) {
    return make_error(ErrorCode::kCorrupt, "{}: header length {} exceeds the file size {} (truncated file?)",
                      src, n, size);
  }
  const uint8_t* header = bytes + 8;
  if (const size_t bad = find_invalid_utf8(header, n); bad != std::string::npos) {
    return make_error(ErrorCode::kCorrupt, "{}: header is not valid UTF-8 (byte {} of the header)", src, bad);
  }

  // nlohmann keeps the last of duplicate keys silently; count top-level keys to catch repeated tensor names.
  std::set<std::string> seen;
  std::string duplicate;
  json::parser_callback_t cb = [&](int depth, json::parse_event_t ev, json& parsed) {
    if (ev == json::parse_event_t::key && depth == 1 && duplicate.empty()) {
      const auto& k = parsed.get_ref<const std::string&>();
      if (!seen.insert(k).second) duplicate = k;
    }
    return true;
  };
  const char* text = reinterpret_cast<const char*>(header);
  json root = json::parse(text, text + n, cb, /*allow_exceptions=*/false);
  if (root.is_discarded()) {
    // Re-parse with exceptions only to obtain the parser's position message.
    std::string why;
    try {
      const json unused = json::parse(text, text + n);
      (void)unused;
    } catch (const json::exception& e) {
      why = e.what();
    }
    return make_error(ErrorCode::kCorrupt, "{}: header is not valid JSON: {}", src, why);
  }
  if (!root.is_object()) {
    return make_error(ErrorCode::kCorrupt, "{}: header is a JSON {}, expected an object", src,
                      root.type_name());
  }
  if (!duplicate.empty()) {
    return make_error(ErrorCode::kCorrupt, "{}: tensor '{}' appears twice in the header", src, duplicate);
  }

  SafetensorsFile f;
  f.path_ = src;
  f.mapping_ = std::move(mapping);
  const uint8_t* data = header + n;
  const uint64_t data_size = size - 8 - n;
  std::vector<std::pair<uint64_t, size_t>> order;  // (begin, index)
  for (const auto& [name, entry] : root.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) {
        return make_error(ErrorCode::kCorrupt, "{}: __metadata__ is {}, expected an object of strings", src,
                          entry.type_name());
      }
      for (const auto& [k, v] : entry.items())
        f.metadata_[k] = v.is_string() ? v.get<std::string>() : v.dump();
      continue;
    }
    TensorInfo t;
    uint64_t begin = 0;
    PD_TRY(parse_entry(src, name, entry, data_size, &t, &begin));
    t.data = data + begin;
    order.emplace_back(begin, f.tensors_.size());
    f.tensors_.push_back(std::move(t));
  }
  std::sort(order.begin(), order.end());
  std::vector<TensorInfo> sorted;
  sorted.reserve(order.size());
  // Empty tensors occupy no bytes and cannot overlap anything.
  const TensorInfo* prev = nullptr;
  uint64_t prev_end = 0;
  for (const auto& [begin, idx] : order) {
    const TensorInfo& t = f.tensors_[idx];
    if (t.nbytes > 0) {
      if (prev != nullptr && begin < prev_end) {
        return make_error(ErrorCode::kCorrupt, "{}: tensors '{}' [{}, {}) and '{}' [{}, {}) overlap", src,
                          prev->name, prev->data - data, prev_end, t.name, begin, begin + t.nbytes);
      }
      prev = &t;
      prev_end = begin + t.nbytes;
    }
  }
  for (const auto& [begin, idx] : order) sorted.push_back(std::move(f.tensors_[idx]));
  f.tensors_ = std::move(sorted);
  return f;
}

namespace {

// model.safetensors.index.json's weight_map: tensor name -> shard file name.
Expected<std::map<std::string, std::string>> read_index(const fs::path& index) {
  PD_ASSIGN_OR_RETURN(std::string text, read_text_file(index.string()));
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return make_error(ErrorCode::kCorrupt, "{}: not a JSON object", index.string());
  }
  auto wm = j.find("weight_map");
  if (wm == j.end() || !wm->is_object()) {
    return make_error(ErrorCode::kCorrupt, "{}: missing 'weight_map' object", index.string());
  }
  std::map<std::string, std::string> out;
  for (const auto& [tensor, shard] : wm->items()) {
    if (!shard.is_string()) {
      return make_error(ErrorCode::kCorrupt, "{}: weight_map['{}'] is {}, expected a file name",
                        index.string(), tensor, shard.type_name());
    }
    auto s = shard.get<std::string>();
    if (s.empty() || s.find('/') != std::string::npos || s == "." || s == "..") {
      return make_error(ErrorCode::kCorrupt,
                        "{}: weight_map['{}'] = '{}' is not a file name in the directory", index.string(),
                        tensor, s);
    }
    out.emplace(tensor, std::move(s));
  }
  if (out.empty()) return make_error(ErrorCode::kCorrupt, "{}: weight_map is empty", index.string());
  return out;
}

fs::path index_path(const std::string& dir) {
  return fs::path(dir) / "model.safetensors.index.json";
}

}  // namespace

Expected<std::vector<std::string>> find_weight_files(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return make_error(ErrorCode::kNotFound, "{}: not a directory", dir);
  const fs::path index = index_path(dir);
  if (fs::exists(index, ec)) {
    PD_ASSIGN_OR_RETURN(auto weight_map, read_index(index));
    std::set<std::string> shards;
    for (const auto& [tensor, shard] : weight_map) shards.insert(shard);
    std::vector<std::string> out;
    for (const auto& s : shards) {
      const fs::path p = fs::path(dir) / s;
      if (!fs::exists(p, ec)) {
        return make_error(ErrorCode::kNotFound, "{}: names shard '{}', which does not exist in {}",
                          index.string(), s, dir);
      }
      out.push_back(p.string());
    }
    return out;
  }
  const fs::path single = fs::path(dir) / "model.safetensors";
  if (fs::exists(single, ec)) return std::vector<std::string>{single.string()};
  std::vector<std::string> found;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().extension() == ".safetensors") found.push_back(e.path().string());
  }
  std::sort(found.begin(), found.end());
  if (found.size() == 1) return found;
  if (found.empty()) {
    return make_error(ErrorCode::kNotFound, "{}: no model.safetensors or model.safetensors.index.json", dir);
  }
  return make_error(
      ErrorCode::kInvalidArgument,
      "{}: {} .safetensors files but no model.safetensors.index.json to say which hold the model: {}", dir,
      found.size(), fmt::join(found, ", "));
}

Expected<TensorStore> TensorStore::open_files(const std::vector<std::string>& paths) {
  TensorStore store;
  for (const auto& p : paths) {
    PD_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::open(p));
    PD_TRY(store.add_file(std::move(f)));
  }
  return store;
}

Expected<TensorStore> TensorStore::listing(std::vector<TensorInfo> tensors) {
  TensorStore store;
  for (auto& t : tensors) {
    auto [it, inserted] = store.index_.emplace(t.name, store.tensors_.size());
    if (!inserted) return make_error(ErrorCode::kInvalidArgument, "tensor '{}' is listed twice", t.name);
    t.data = nullptr;
    store.tensors_.push_back(std::move(t));
  }
  return store;
}

Status TensorStore::add_file(SafetensorsFile file) {
  for (const auto& t : file.tensors()) {
    auto [it, inserted] = index_.emplace(t.name, tensors_.size());
    if (!inserted) {
      return make_error(ErrorCode::kCorrupt, "tensor '{}' appears in both {} and {}", t.name,
                        tensors_[it->second].file, t.file);
    }
    tensors_.push_back(t);
  }
  files_.push_back(std::move(file));
  return Status::ok();
}

Expected<TensorStore> TensorStore::open_dir(const std::string& dir) {
  PD_ASSIGN_OR_RETURN(auto paths, find_weight_files(dir));
  PD_ASSIGN_OR_RETURN(TensorStore store, open_files(paths));
  const fs::path index = index_path(dir);
  std::error_code ec;
  if (!fs::exists(index, ec)) return store;
  PD_ASSIGN_OR_RETURN(auto weight_map, read_index(index));
  size_t unlisted = 0;
  for (const auto& [tensor, shard] : weight_map) {
    const TensorInfo* t = store.find(tensor);
    const std::string want = (fs::path(dir) / shard).string();
    if (t == nullptr) {
      return make_error(ErrorCode::kCorrupt, "{}: tensor '{}' is mapped to {}, which does not contain it",
                        index.string(), tensor, shard);
    }
    if (t->file != want) {
      return make_error(ErrorCode::kCorrupt, "{}: tensor '{}' is mapped to {} but found in {}",
                        index.string(), tensor, shard, t->file);
    }
  }
  for (const auto& t : store.tensors()) unlisted += weight_map.count(t.name) ? 0 : 1;
  if (unlisted > 0) {
    PD_LOG_WARN("{}: {} tensors in the shards are not listed in the index; using them anyway", index.string(),
                unlisted);
  }
  return store;
}

const TensorInfo* TensorStore::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

uint64_t TensorStore::total_bytes() const {
  uint64_t n = 0;
  for (const auto& t : tensors_) n += t.nbytes;
  return n;
}

}  // namespace pd
