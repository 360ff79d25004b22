// TensorBinder: the model-independent half of binding a checkpoint. It indexes an opened TensorStore by
// canonical name (tensor_names.h), binds a module as a Matrix view (float, or MLX affine when the module's
// `.scales` exists) and a float tensor as f32 values, checks every stored shape against the one the caller
// expects (errors name the tensor as the file spells it and both shapes) and an affine module's bits and
// group size against config.json's quantization block, and records how each tensor was bound for the
// tensor listing. Which tensors a model has, and their shapes, is the model's (model/loader.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "puredrive/checkpoint/affine.h"
#include "puredrive/checkpoint/safetensors.h"
#include "puredrive/checkpoint/weights.h"
#include "puredrive/util/status.h"

namespace pd {

// One stored tensor as inspect shows it.
struct TensorListing {
  std::string name;  // as stored
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t nbytes = 0;
  std::string format;  // e.g. "bf16", "affine q4 g64", "affine q4 g64 scales", "norm (+1 folded)", "unused"
  std::string file;
};

// "[8192, 1, 4]"
std::string format_shape(const std::vector<int64_t>& shape);

class TensorBinder {
 public:
  // dir names the checkpoint in messages. quantization: config.json's block, or null. storage keeps the
  // load-time copies of tensors the file does not align.
  TensorBinder(const TensorStore& store, std::string dir, const QuantizationConfig* quantization,
               std::vector<std::shared_ptr<const void>>* storage);

  // Indexes the store by canonical name, skipping vision-tower tensors; two stored names with one canonical
  // name are an error.
  Status index();
  size_t vision_count() const { return vision_count_; }
  // Canonical names of the indexed tensors, in no particular order.
  std::vector<std::string> names() const;

  bool has(const std::string& cname) const { return by_name_.count(cname) > 0; }
  // The stored tensor under a canonical name, or null.
  const TensorInfo* find(const std::string& cname) const;
  // The canonical name spelled with the checkpoint's own prefixes, for messages.
  std::string display(const std::string& cname) const;

  Status missing(const std::string& cname, const std::vector<int64_t>& want) const;
  Status wrong_shape(const std::string& cname, const std::vector<int64_t>& want,
                     const std::vector<int64_t>& got, const char* what = "") const;

  // Module `m` stored as [lead..., rows, cols] (cols packed when quantized), returned as a 2-D matrix
  // [product(lead) * rows, cols]. The weight is `m.weight`, or `m` itself (fused experts carry no suffix).
  Expected<Matrix> matrix(const std::string& m, const std::vector<int64_t>& lead, int64_t rows, int64_t cols);
  // Every element of the existing tensor `cname` (F32, BF16 or F16) as f32, plus one when add_one; the
  // caller has checked its shape. `format` is what the listing shows for it.
  Expected<std::vector<float>> floats(const std::string& cname, bool add_one, const char* format);
  // Appends to the listing format of `cname`, if it is stored.
  void append_format(const std::string& cname, const std::string& suffix);

  // Every stored tensor by name ("layers.10" after "layers.9") with how it was bound. ignored(cname) returns
  // a label for tensors deliberately left out (or null); vision-tower tensors are labelled as such. The
  // stored names bound to nothing else are the unused ones, also sorted.
  std::vector<TensorListing> listing(const std::function<const char*(const std::string&)>& ignored,
                                     std::vector<std::string>* unused) const;

 private:
  struct Entry {
    const TensorInfo* t = nullptr;
    bool used = false;
    std::string format;
  };

  Entry* entry(const std::string& cname);
  std::optional<QuantParams> expected_quant(const std::string& module) const;
  const void* data_of(const TensorInfo& t);
  Expected<Matrix> affine_matrix(const std::string& m, const std::string& wname, Entry* w, Entry* scales,
                                 const std::vector<int64_t>& want, int64_t cols);

  const TensorStore& store_;
  std::string dir_;
  const QuantizationConfig* quantization_;
  std::vector<std::shared_ptr<const void>>* storage_;
  std::unordered_map<std::string, Entry> by_name_;
  std::unordered_map<std::string, const char*> stored_prefix_;  // canonical prefix -> stored prefix
  std::unordered_map<std::string, QuantParams> overrides_;      // canonical module path -> params
  size_t vision_count_ = 0;
};

}  // namespace pd
