// Test-only: a backend that wraps another (the CPU backend) and counts how the host waits for it, which calls
// fall inside a recorded step, and its copies.
#pragma once

#include <memory>
#include <span>
#include <string>

#include "puredrive/backend/backend.h"

namespace pd::test {

class CountingBackend final : public Backend {
 public:
  explicit CountingBackend(std::unique_ptr<Backend> inner) : in_(std::move(inner)) {}

  int64_t downloads = 0, downloads_in_step = 0, synchronizes = 0, uploads_outside = 0, steps = 0;
  int64_t copies = 0, copy_manys = 0;
  int64_t downloads_at_synchronize = -1;  // the download count when synchronize() was last called
  int depth = 0;

  Device device() const override { return in_->device(); }
  std::string name() const override { return "counting " + in_->name(); }
  Expected<Buffer> alloc(DType t, int64_t r, int64_t c) override { return in_->alloc(t, r, c); }
  Status upload(const Tensor& dst, const void* src) override {
    if (depth == 0) ++uploads_outside;
    return in_->upload(dst, src);
  }
  Status download(void* dst, const Tensor& src) override {
    ++downloads;
    if (depth > 0) ++downloads_in_step;
    return in_->download(dst, src);
  }
  Status copy(const Tensor& dst, const Tensor& src) override {
    ++copies;
    return in_->copy(dst, src);
  }
  Status fill_zero(const Tensor& dst) override { return in_->fill_zero(dst); }
  Status copy_many(std::span<const CopyRegion> regions) override {
    ++copy_manys;
    return in_->copy_many(regions);
  }
  Status synchronize() override {
    ++synchronizes;
    downloads_at_synchronize = downloads;
    return in_->synchronize();
  }
  int64_t available_memory() const override { return in_->available_memory(); }
  Status begin_step() override {
    if (depth++ == 0) ++steps;
    return Status::ok();
  }
  Status end_step() override {
    if (depth == 0) return make_error(ErrorCode::kInternal, "end_step without begin_step");
    --depth;
    return Status::ok();
  }
  Expected<MatrixId> bind_matrix(const Matrix& m) override { return in_->bind_matrix(m); }
  Expected<VectorId> bind_vector(std::span<const float> v, const std::string& n) override {
    return in_->bind_vector(v, n);
  }
  Expected<MoeId> bind_moe(const MoeWeights& w, const MoeSpec& s) override { return in_->bind_moe(w, s); }
  int64_t bound_bytes() const override { return in_->bound_bytes(); }
  Status embed(const EmbedArgs& a) override { return in_->embed(a); }
  Status rms_norm(const RmsNormArgs& a) override { return in_->rms_norm(a); }
  Status add(const AddArgs& a) override { return in_->add(a); }
  Status matmul(const MatmulArgs& a) override { return in_->matmul(a); }
  Status matmuls(const MatmulsArgs& a) override { return in_->matmuls(a); }
  Status gated_attention(const GatedAttentionArgs& a) override { return in_->gated_attention(a); }
  Status gated_delta_net(const GatedDeltaNetArgs& a) override { return in_->gated_delta_net(a); }
  Status moe(const MoeArgs& a) override { return in_->moe(a); }
  Status argmax(const ArgmaxArgs& a) override { return in_->argmax(a); }
  Status sample(const SampleArgs& a) override { return in_->sample(a); }

 private:
  std::unique_ptr<Backend> in_;
};

}  // namespace pd::test
