// The CUDA backend's layer ops: gated_attention (attention*.cu), gated_delta_net (gated_delta_net.cu,
// gdn_*.cu) and moe (moe.cu, moe_grouped.cu).
#include <cuda_runtime_api.h>

#include <cstdint>

#include "puredrive/backend/cuda/cuda_backend_impl.h"

namespace pd::cuda_impl {

static_assert(cuda::kGdnPrefillChunk == kGdnPrefillChunk, "the prefill kernels' chunk is backend.h's");

namespace {

// What the attention kernels need beyond validate_gated_attention: 16-byte aligned KV caches.
Status check_kv_aligned(const char* op, const char* arg, const Tensor& t) {
  if (reinterpret_cast<uintptr_t>(t.data) % 16 != 0) {
    return make_error(ErrorCode::kInvalidArgument, "{}: {} is not 16-byte aligned", op, arg);
  }
  return Status::ok();
}

}  // namespace

Status CudaBackend::gated_attention(const GatedAttentionArgs& a) {
  PD_TRY(validate_gated_attention(Device::kCuda, a));
  const AttentionDims& d = a.dims;
  if (d.head_dim % 8 != 0 || d.head_dim > 1024 || d.num_heads / d.num_kv_heads > cuda::kMaxGroup) {
    return make_error(
        ErrorCode::kUnsupported,
        "gated_attention: the CUDA kernels need a head dim that is a multiple of 8 and at most 1024 and "
        "at most {} query heads per KV head (got head dim {}, {} heads per KV head)",
        cuda::kMaxGroup, d.head_dim, d.num_heads / d.num_kv_heads);
  }
  if (a.window != 0) {
    return make_error(ErrorCode::kUnsupported,
                      "gated_attention: a window of {} positions asked; the CUDA attention kernels attend "
                      "every cached position (the MTP attention window runs on the CPU backend only)",
                      a.window);
  }
  PD_TRY(check_kv_aligned("gated_attention", "cache.k", a.cache.k));
  PD_TRY(check_kv_aligned("gated_attention", "cache.v", a.cache.v));
  PD_ASSIGN_OR_RETURN(const DevVector* qn, vector("gated_attention", a.q_norm, d.head_dim));
  PD_ASSIGN_OR_RETURN(const DevVector* kn, vector("gated_attention", a.k_norm, d.head_dim));
  cuda::AttentionLaunch l;
  l.smem_limit = smem_optin_;
  l.multiprocessors = info_.multiprocessors;
  l.num_heads = d.num_heads;
  l.num_kv_heads = d.num_kv_heads;
  l.head_dim = d.head_dim;
  l.rotary_dim = d.rotary_dim;
  l.rope_theta = static_cast<float>(d.rope_theta);
  l.eps = d.eps;
  l.qg = static_cast<const float*>(a.qg.data);
  l.qg_stride = a.qg.stride;
  l.k = static_cast<const float*>(a.k.data);
  l.k_stride = a.k.stride;
  l.v = static_cast<const float*>(a.v.data);
  l.v_stride = a.v.stride;
  l.q_norm = qn->data;
  l.k_norm = kn->data;
  l.positions = static_cast<const int32_t*>(a.positions.data);
  l.position_stride = a.positions.stride;
  l.cache_k = a.cache.k.data;
  l.cache_v = a.cache.v.data;
  l.cache_bf16 = a.cache.k.dtype == DType::kBF16;
  l.capacity = a.cache.k.rows;
  l.out = static_cast<float*>(a.out.data);
  l.out_stride = a.out.stride;
  l.rows = static_cast<int>(a.qg.rows);
  l.prefill = a.prefill && !reference_prefill_;
  PD_ASSIGN_OR_RETURN(void* scr, scratch(attn_scratch_, cuda::attention_scratch_floats(l) * 4));
  l.scratch = static_cast<float*>(scr);

  sig_.add(OpTag::kAttention);
  for (int v : {d.num_heads, d.num_kv_heads, d.head_dim, d.rotary_dim}) sig_.add(v);
  sig_.add_d(d.rope_theta);
  sig_.add_f(d.eps);
  for (const Tensor* t : {&a.qg, &a.k, &a.v, &a.positions, &a.cache.k, &a.cache.v, &a.out}) sig_.add(*t);
  sig_.add(a.q_norm.index);
  sig_.add(a.k_norm.index);
  sig_.add(static_cast<int32_t>(l.prefill));
  step_prefill_ = step_prefill_ || a.prefill;
  submit([l](cudaStream_t s) { cuda::launch_attention(l, s); }, "gated_attention");
  return take_error_if_eager();
}

Status CudaBackend::gated_delta_net(const GatedDeltaNetArgs& a) {
  PD_TRY(validate_gated_delta_net(Device::kCuda, a));
  const GdnDims& d = a.dims;
  if (!cuda::gdn_supported(d.k_head_dim, d.v_head_dim, d.num_k_heads, d.num_v_heads) ||
      d.conv_kernel > cuda::kMaxConvKernel) {
    return make_error(
        ErrorCode::kUnsupported,
        "gated_delta_net: the CUDA kernels support key head dims 16/32/64/128/256, value head dims "
        "8..128 (multiples of 8), up to 8 value heads per key head and conv kernels up to {} (got {}, {}, "
        "{} and {} value heads for {} key heads)",
        cuda::kMaxConvKernel, d.k_head_dim, d.v_head_dim, d.conv_kernel, d.num_v_heads, d.num_k_heads);
  }
  if (a.prefill && cuda::gdn_prefill_smem_bytes(d.k_head_dim, d.v_head_dim) > smem_optin_) {
    return make_error(
        ErrorCode::kUnsupported,
        "gated_delta_net: the prefill kernels need {} bytes of shared memory for key head dim {} "
        "and value head dim {}; the device allows {}",
        cuda::gdn_prefill_smem_bytes(d.k_head_dim, d.v_head_dim), d.k_head_dim, d.v_head_dim, smem_optin_);
  }
  const int64_t rows = a.qkv.rows;
  const int64_t channels = 2 * int64_t{d.num_k_heads} * d.k_head_dim + int64_t{d.num_v_heads} * d.v_head_dim;
  PD_ASSIGN_OR_RETURN(const DevVector* conv1d, vector("gated_delta_net", a.conv1d, channels * d.conv_kernel));
  PD_ASSIGN_OR_RETURN(const DevVector* a_log, vector("gated_delta_net", a.A_log, d.num_v_heads));
  PD_ASSIGN_OR_RETURN(const DevVector* dt_bias, vector("gated_delta_net", a.dt_bias, d.num_v_heads));
  PD_ASSIGN_OR_RETURN(const DevVector* norm, vector("gated_delta_net", a.norm, d.v_head_dim));
  void* scr = nullptr;
  if (a.prefill) {
    const int64_t floats = cuda::gdn_prefill_scratch_floats(
        static_cast<int>(channels), d.num_v_heads, d.k_head_dim, d.v_head_dim, static_cast<int>(rows));
    PD_ASSIGN_OR_RETURN(scr, scratch(gdn_scratch_, floats * 4));
  }

  cuda::GdnLaunch g;
  g.num_k_heads = d.num_k_heads;
  g.num_v_heads = d.num_v_heads;
  g.k_head_dim = d.k_head_dim;
  g.v_head_dim = d.v_head_dim;
  g.conv_kernel = d.conv_kernel;
  g.eps = d.eps;
  g.qkv = static_cast<const float*>(a.qkv.data);
  g.qkv_stride = a.qkv.stride;
  g.z = static_cast<const float*>(a.z.data);
  g.z_stride = a.z.stride;
  g.b = static_cast<const float*>(a.b.data);
  g.b_stride = a.b.stride;
  g.a = static_cast<const float*>(a.a.data);
  g.a_stride = a.a.stride;
  g.conv1d = conv1d->data;
  g.A_log = a_log->data;
  g.dt_bias = dt_bias->data;
  g.norm = norm->data;
  g.conv_state = static_cast<float*>(a.state.conv.data);
  g.recurrent = static_cast<float*>(a.state.recurrent.data);
  if (!a.snapshots.empty()) {
    g.snap_conv = static_cast<float*>(a.snapshots.conv.data);
    g.snap_conv_stride = a.snapshots.conv.stride;
    g.snap_recurrent = static_cast<float*>(a.snapshots.recurrent.data);
    g.snap_recurrent_stride = a.snapshots.recurrent.stride;
  }
  g.out = static_cast<float*>(a.out.data);
  g.out_stride = a.out.stride;
  g.rows = static_cast<int>(rows);
  g.scratch = static_cast<float*>(scr);
  if (a.prefill) {
    g.chunk_offset = a.position % cuda::kGdnPrefillChunk;
    const cuda::GdnPrefillCaps caps = cuda::gdn_prefill_caps(g.rows);
    g.seg_rows_cap = caps.rows;
    g.seg_chunks_cap = caps.chunks;
  }

  step_prefill_ = step_prefill_ || a.prefill;
  sig_.add(OpTag::kGdn);
  // A recorded prefill replays its chunk boundaries: they depend on the position modulo the chunk only.
  for (int v : {d.num_k_heads, d.num_v_heads, d.k_head_dim, d.v_head_dim, d.conv_kernel, int{a.prefill},
                g.chunk_offset}) {
    sig_.add(v);
  }
  sig_.add_f(d.eps);
  for (const Tensor* t : {&a.qkv, &a.z, &a.b, &a.a, &a.state.conv, &a.state.recurrent, &a.snapshots.conv,
                          &a.snapshots.recurrent, &a.out}) {
    sig_.add(*t);
  }
  for (VectorId id : {a.conv1d, a.A_log, a.dt_bias, a.norm}) sig_.add(id.index);
  if (a.prefill) {
    submit([g](cudaStream_t s) { cuda::launch_gated_delta_net_prefill(g, s); }, "gated_delta_net prefill");
  } else {
    submit([g](cudaStream_t s) { cuda::launch_gated_delta_net(g, s); }, "gated_delta_net");
  }
  return take_error_if_eager();
}

Status CudaBackend::moe(const MoeArgs& a) {
  if (a.moe.index < 0 || a.moe.index >= static_cast<int32_t>(moes_.size())) {
    return make_error(ErrorCode::kInvalidArgument, "moe: unbound MoE handle {}", a.moe.index);
  }
  const BoundMoe& m = moes_[static_cast<size_t>(a.moe.index)];
  PD_TRY(validate_moe_args(Device::kCuda, a, m.launch.hidden));
  if (reinterpret_cast<uintptr_t>(a.x.data) % 16 != 0 || a.x.stride % 4 != 0) {
    return make_error(ErrorCode::kUnsupported,
                      "moe: x must be 16-byte aligned with a row stride divisible by 4");
  }
  const Kernels k = kernels_for(a.prefill, a.x.rows);
  const cuda::MoeLaunch& b = m.launch;
  const int64_t bytes = k == Kernels::kTensorCores
                            ? cuda::moe_grouped_scratch_bytes(static_cast<int>(a.x.rows), b.experts, b.top_k,
                                                              b.hidden, b.inter, b.shared_inter)
                            : cuda::moe_scratch_bytes(b.experts, b.top_k, b.hidden, b.inter, b.shared_inter);
  PD_ASSIGN_OR_RETURN(void* scr, scratch(moe_scratch_, bytes));
  cuda::MoeLaunch l = m.launch;
  PD_ASSIGN_OR_RETURN(const Tensor x, normalized_input("moe", a.x, a.norm));
  l.x = static_cast<const float*>(x.data);
  l.x_stride = x.stride;
  l.out = static_cast<float*>(a.out.data);
  l.out_stride = a.out.stride;
  l.accumulate = a.accum == Accum::kAdd;
  l.rows = static_cast<int>(a.x.rows);
  l.scratch = scr;
  l.experts_read = experts_read_;
  l.router_ticket = router_ticket_;
  sig_.add(OpTag::kMoe);
  sig_.add(a.moe.index);
  sig_.add(static_cast<int32_t>(a.accum));
  sig_.add(x);  // the rows the kernels read (the norm, when there is one, has its own signature)
  sig_.add(a.out);
  sig_.add(k);
  if (k == Kernels::kTensorCores) {
    submit([l](cudaStream_t s) { cuda::launch_moe_grouped(l, s); }, "moe prefill");
    return take_error_if_eager();
  }
  if (profiling_ && !recording()) {
    double ms[cuda::kMoePhases] = {};
    cuda::launch_moe_profiled(l, stream_, ms);
    note_error(cudaGetLastError(), "kernel launch");
    static const char* const kPhases[cuda::kMoePhases] = {
        "moe: router + shared gate + route", "moe: gate/up experts (streamed blocks: + router, route)",
        "moe: down experts + combine"};
    for (int i = 0; i < cuda::kMoePhases; ++i) {
      CudaOpTime& t = profile_[kPhases[i]];
      ++t.count;
      t.seconds += ms[i] * 1e-3;
    }
    return take_error();
  }
  submit([l](cudaStream_t s) { cuda::launch_moe(l, s); }, "moe");
  return take_error_if_eager();
}

}  // namespace pd::cuda_impl
