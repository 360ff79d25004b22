#include "puredrive/checkpoint/tensor_binder.h"

#include <algorithm>
#include <cstring>

#include "puredrive/checkpoint/tensor_names.h"
#include "puredrive/util/log.h"

namespace pd {
namespace {

int64_t product(const std::vector<int64_t>& v) {
  int64_t n = 1;
  for (int64_t d : v) n *= d;
  return n;
}

float read_float(const TensorInfo& t, int64_t i) {
  switch (t.dtype) {
    case DType::kF32: {
      float f;
      std::memcpy(&f, t.data + 4 * i, 4);
      return f;
    }
    case DType::kBF16: {
      uint16_t h;
      std::memcpy(&h, t.data + 2 * i, 2);
      return bf16_to_f32(h);
    }
    case DType::kF16: {
      uint16_t h;
      std::memcpy(&h, t.data + 2 * i, 2);
      return f16_to_f32(h);
    }
    default:
      PD_ASSERT(false, "read_float on {}", dtype_name(t.dtype));
  }
  return 0.0f;
}

bool is_float(DType t) {
  return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16;
}

}  // namespace

std::string format_shape(const std::vector<int64_t>& s) {
  return fmt::format("[{}]", fmt::join(s, ", "));
}

TensorBinder::TensorBinder(const TensorStore& store, std::string dir, const QuantizationConfig* quantization,
                           std::vector<std::shared_ptr<const void>>* storage)
    : store_(store), dir_(std::move(dir)), quantization_(quantization), storage_(storage) {}

Status TensorBinder::index() {
  for (const auto& t : store_.tensors()) {
    const NamePrefix* r = match_name_prefix(t.name);
    if (r != nullptr && r->canonical == nullptr) {
      ++vision_count_;
      continue;
    }
    std::string cname = canonical_tensor_name(t.name);
    if (r != nullptr) stored_prefix_.emplace(r->canonical, r->stored);
    auto [it, inserted] = by_name_.emplace(cname, Entry{&t, false, {}});
    if (!inserted) {
      return make_error(ErrorCode::kInvalidArgument, "{}: tensors '{}' and '{}' both name '{}'", dir_,
                        it->second.t->name, t.name, cname);
    }
  }
  if (quantization_ != nullptr) {
    for (const auto& [key, q] : quantization_->overrides) {
      std::string k = canonical_tensor_name(key + ".");
      if (!k.empty()) k.pop_back();
      overrides_[k] = q;
    }
  }
  return Status::ok();
}

std::vector<std::string> TensorBinder::names() const {
  std::vector<std::string> out;
  out.reserve(by_name_.size());
  for (const auto& [name, e] : by_name_) out.push_back(name);
  return out;
}

TensorBinder::Entry* TensorBinder::entry(const std::string& cname) {
  auto it = by_name_.find(cname);
  return it == by_name_.end() ? nullptr : &it->second;
}

const TensorInfo* TensorBinder::find(const std::string& cname) const {
  auto it = by_name_.find(cname);
  return it == by_name_.end() ? nullptr : it->second.t;
}

std::string TensorBinder::display(const std::string& cname) const {
  for (const char* canon : {"model.", "mtp.", "lm_head."}) {
    if (cname.starts_with(canon)) {
      auto it = stored_prefix_.find(canon);
      if (it != stored_prefix_.end()) return it->second + cname.substr(std::strlen(canon));
    }
  }
  return cname;
}

Status TensorBinder::missing(const std::string& cname, const std::vector<int64_t>& want) const {
  return make_error(ErrorCode::kNotFound, "{}: missing tensor '{}' (expected shape {})", dir_, display(cname),
                    format_shape(want));
}

Status TensorBinder::wrong_shape(const std::string& cname, const std::vector<int64_t>& want,
                                 const std::vector<int64_t>& got, const char* what) const {
  return make_error(ErrorCode::kInvalidArgument, "{}: tensor '{}'{}: expected shape {}, file has {}", dir_,
                    display(cname), what, format_shape(want), format_shape(got));
}

std::optional<QuantParams> TensorBinder::expected_quant(const std::string& module) const {
  if (quantization_ == nullptr) return std::nullopt;
  auto it = overrides_.find(module);
  if (it != overrides_.end()) return it->second;
  return quantization_->global;
}

const void* TensorBinder::data_of(const TensorInfo& t) {
  const size_t align = dtype_size(t.dtype);
  if (reinterpret_cast<uintptr_t>(t.data) % align == 0) return t.data;
  // safetensors does not promise alignment; kernels read whole elements, so misaligned tensors get a copy.
  auto buf = std::make_shared<std::vector<uint8_t>>(t.data, t.data + t.nbytes);
  storage_->push_back(buf);
  PD_LOG_DEBUG("{}: '{}' is not {}-byte aligned in the file; copied", dir_, t.name, align);
  return buf->data();
}

Expected<Matrix> TensorBinder::matrix(const std::string& m, const std::vector<int64_t>& lead, int64_t rows,
                                      int64_t cols) {
  std::vector<int64_t> want = lead;
  want.push_back(rows);
  want.push_back(cols);
  std::string wname = m + ".weight";
  Entry* w = entry(wname);
  if (w == nullptr && (w = entry(m)) != nullptr) wname = m;  // fused experts carry no ".weight" suffix
  if (w == nullptr) return missing(m + ".weight", want);
  if (Entry* scales = entry(m + ".scales")) return affine_matrix(m, wname, w, scales, want, cols);

  const TensorInfo& t = *w->t;
  Matrix out;
  switch (t.dtype) {
    case DType::kF32:
      out.format = WeightFormat::kF32;
      break;
    case DType::kBF16:
      out.format = WeightFormat::kBF16;
      break;
    case DType::kF16:
      out.format = WeightFormat::kF16;
      break;
    case DType::kU32:
      return make_error(ErrorCode::kInvalidArgument,
                        "{}: tensor '{}' is U32 (packed codes) but '{}' is missing", dir_, t.name,
                        display(m + ".scales"));
    default:
      return make_error(ErrorCode::kUnsupported,
                        "{}: tensor '{}' has dtype {}; matrices must be F32, BF16, F16 or "
                        "MLX affine (U32 + scales + biases)",
                        dir_, t.name, dtype_name(t.dtype));
  }
  if (t.shape != want) return wrong_shape(wname, want, t.shape);
  out.rows = product(lead) * rows;
  out.cols = cols;
  out.data = data_of(t);
  out.name = m;
  w->used = true;
  w->format = weight_format_name(out.format);
  return out;
}

Expected<Matrix> TensorBinder::affine_matrix(const std::string& m, const std::string& wname, Entry* w,
                                             Entry* sc, const std::vector<int64_t>& want, int64_t cols) {
  Entry* bi = entry(m + ".biases");
  if (bi == nullptr) {
    return make_error(ErrorCode::kNotFound, "{}: '{}' exists but '{}' is missing (MLX affine needs both)",
                      dir_, display(m + ".scales"), display(m + ".biases"));
  }
  const TensorInfo& t = *w->t;
  const TensorInfo& s = *sc->t;
  const TensorInfo& b = *bi->t;
  if (t.dtype != DType::kU32) {
    return make_error(ErrorCode::kInvalidArgument,
                      "{}: '{}' has scales, so it must hold U32 packed codes; found {}", dir_, t.name,
                      dtype_name(t.dtype));
  }
  if (!is_float(s.dtype) || b.dtype != s.dtype) {
    return make_error(ErrorCode::kInvalidArgument,
                      "{}: '{}' is {} and '{}' is {}; expected the same float dtype", dir_, s.name,
                      dtype_name(s.dtype), b.name, dtype_name(b.dtype));
  }
  // Everything but the last dim must match the float shape; the last dims give bits and group size.
  const std::vector<int64_t> outer(want.begin(), want.end() - 1);
  auto outer_ok = [&](const std::vector<int64_t>& sh) {
    return sh.size() == want.size() && std::equal(outer.begin(), outer.end(), sh.begin());
  };
  if (!outer_ok(t.shape)) {
    return wrong_shape(wname, want, t.shape, " (quantized: last dim = packed words)");
  }
  if (!outer_ok(s.shape) || s.shape.back() <= 0) {
    return wrong_shape(m + ".scales", want, s.shape, " (scales: last dim = groups)");
  }
  if (b.shape != s.shape) return wrong_shape(m + ".biases", s.shape, b.shape);
  const int64_t groups = s.shape.back();
  const int64_t packed = t.shape.back();
  if (cols % groups != 0 || (packed * 32) % cols != 0) {
    return make_error(ErrorCode::kInvalidArgument,
                      "{}: '{}': {} packed words and {} groups do not fit an input width of {}", dir_, t.name,
                      packed, groups, cols);
  }
  const int gs = static_cast<int>(cols / groups);
  const int bits = static_cast<int>(packed * 32 / cols);
  if (!affine_bits_supported(bits) || (gs != 32 && gs != 64 && gs != 128)) {
    return make_error(
        ErrorCode::kUnsupported,
        "{}: '{}': shapes imply {} bits and group size {}; supported are bits 2-6, 8 and groups 32, 64, "
        "128",
        dir_, t.name, bits, gs);
  }
  if (auto q = expected_quant(m)) {
    if (q->bits == 0) {
      return make_error(ErrorCode::kInvalidArgument, "{}: config.json keeps '{}' in float, but '{}' exists",
                        dir_, display(m), display(m + ".scales"));
    }
    if (q->bits != bits || q->group_size != gs) {
      return make_error(ErrorCode::kInvalidArgument,
                        "{}: '{}': config.json says {}-bit group {}, the tensor shapes say {}-bit group {}",
                        dir_, display(m), q->bits, q->group_size, bits, gs);
    }
  }
  Matrix out;
  out.format = WeightFormat::kAffine;
  out.rows = product(outer);
  out.cols = cols;
  out.bits = bits;
  out.group_size = gs;
  out.scale_dtype = s.dtype;
  out.data = data_of(t);
  out.scales = data_of(s);
  out.biases = data_of(b);
  out.name = m;
  const std::string f = fmt::format("affine q{} g{}", bits, gs);
  w->used = sc->used = bi->used = true;
  w->format = f;
  sc->format = f + " scales";
  bi->format = f + " biases";
  return out;
}

Expected<std::vector<float>> TensorBinder::floats(const std::string& cname, bool add_one,
                                                  const char* format) {
  Entry* e = entry(cname);
  PD_ASSERT(e != nullptr, "floats('{}'): the caller checks that the tensor exists", cname);
  const TensorInfo& t = *e->t;
  if (!is_float(t.dtype)) {
    return make_error(ErrorCode::kInvalidArgument, "{}: '{}' has dtype {}, expected F32, BF16 or F16", dir_,
                      t.name, dtype_name(t.dtype));
  }
  const int64_t n = t.numel();
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = add_one ? 1.0f + read_float(t, i) : read_float(t, i);
  e->used = true;
  e->format = format;
  return v;
}

void TensorBinder::append_format(const std::string& cname, const std::string& suffix) {
  if (Entry* e = entry(cname)) e->format += suffix;
}

std::vector<TensorListing> TensorBinder::listing(
    const std::function<const char*(const std::string&)>& ignored, std::vector<std::string>* unused) const {
  std::vector<TensorListing> out;
  for (const auto& t : store_.tensors()) {
    TensorListing l{t.name, t.dtype, t.shape, t.nbytes, {}, t.file};
    const std::string cname = canonical_tensor_name(t.name);
    const char* label = cname.empty() ? nullptr : ignored(cname);
    auto it = by_name_.find(cname);
    if (cname.empty()) {
      l.format = "ignored (vision tower)";
    } else if (label != nullptr) {
      l.format = label;
    } else if (it != by_name_.end() && it->second.used) {
      l.format = it->second.format;
    } else {
      l.format = "UNUSED";
      unused->push_back(t.name);
    }
    out.push_back(std::move(l));
  }
  std::sort(out.begin(), out.end(),
            [](const TensorListing& a, const TensorListing& b) { return natural_less(a.name, b.name); });
  std::sort(unused->begin(), unused->end(), natural_less);
  return out;
}

}  // namespace pd
