#include "puredrive/backend/cuda/copy_runner.h"

#include <cstring>

namespace pd::cuda {
namespace {

Status copy_error(cudaError_t e, const char* what) {
  return make_error(ErrorCode::kInternal, "CUDA: {} failed in copy_many: {} ({})", what,
                    cudaGetErrorString(e), cudaGetErrorName(e));
}

#define PD_COPY_TRY(call)                                                    \
  do {                                                                       \
    const cudaError_t pd_copy_err_ = (call);                                 \
    if (pd_copy_err_ != cudaSuccess) return copy_error(pd_copy_err_, #call); \
  } while (0)

constexpr int64_t kSlotGranule = int64_t{1} << 20;

}  // namespace

CopyRunner::~CopyRunner() {
  for (Slot& s : slots_) {
    if (s.done != nullptr) {
      cudaEventSynchronize(s.done);
      cudaEventDestroy(s.done);
    }
    if (s.host != nullptr) cudaFreeHost(s.host);
  }
}

Status CopyRunner::grow(Slot& s, int64_t bytes) {
  if (s.done == nullptr) PD_COPY_TRY(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming));
  if (s.host != nullptr) PD_COPY_TRY(cudaFreeHost(s.host));
  s.host = s.device = nullptr;
  s.bytes = 0;
  const int64_t size = (bytes + kSlotGranule - 1) / kSlotGranule * kSlotGranule;
  void* host = nullptr;
  const cudaError_t e = cudaHostAlloc(&host, static_cast<size_t>(size), cudaHostAllocMapped);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return make_error(ErrorCode::kOutOfMemory, "copy_many: cannot allocate {} bytes of pinned memory: {}",
                      size, cudaGetErrorString(e));
  }
  s.host = static_cast<uint8_t*>(host);
  void* device = nullptr;
  PD_COPY_TRY(cudaHostGetDevicePointer(&device, host, 0));
  s.device = static_cast<uint8_t*>(device);
  s.bytes = size;
  return Status::ok();
}

Expected<CopyRunner::Slot*> CopyRunner::slot(int64_t bytes, int64_t& host_waits) {
  Slot* idle = nullptr;  // a slot no queued launch reads, too small or not allocated yet
  Slot* oldest = nullptr;
  for (Slot& s : slots_) {
    if (oldest == nullptr || s.last_run < oldest->last_run) oldest = &s;
    if (s.done != nullptr) {
      const cudaError_t e = cudaEventQuery(s.done);
      if (e == cudaErrorNotReady) {
        // Not an error: keep it from looking like a failed launch to the next cudaGetLastError().
        if (cudaPeekAtLastError() == cudaErrorNotReady) cudaGetLastError();
        continue;
      }
      if (e != cudaSuccess) return copy_error(e, "cudaEventQuery");
      if (s.bytes >= bytes) return &s;
    }
    if (idle == nullptr) idle = &s;
  }
  if (idle == nullptr) {
    ++host_waits;
    PD_COPY_TRY(cudaEventSynchronize(oldest->done));
    if (oldest->bytes >= bytes) return oldest;
    idle = oldest;
  }
  PD_TRY(grow(*idle, bytes));
  return idle;
}

Status CopyRunner::run(const std::vector<CopySpan>& spans, int64_t& host_waits) {
  for (const CopyRound& r : plan_copies(spans)) {
    PD_ASSIGN_OR_RETURN(Slot * s, slot(r.pinned_bytes(), host_waits));
    r.write_table(s->host, s->device);
    uint8_t* data = s->host + r.data_offset();
    for (const StagedIn& in : r.in) std::memcpy(data + in.offset, in.host, static_cast<size_t>(in.bytes));
    launch_copy_pieces(reinterpret_cast<const CopyPiece*>(s->device), static_cast<int64_t>(r.pieces.size()),
                       stream_);
    PD_COPY_TRY(cudaGetLastError());
    PD_COPY_TRY(cudaEventRecord(s->done, stream_));
    s->last_run = ++runs_;
    if (r.out.empty()) continue;
    ++host_waits;
    PD_COPY_TRY(cudaEventSynchronize(s->done));
    for (const StagedOut& out : r.out) {
      std::memcpy(out.host, data + out.offset, static_cast<size_t>(out.bytes));
    }
  }
  return Status::ok();
}

}  // namespace pd::cuda
