// Test-only: runs CUDA kernel source on the CPU, so that kernels can be checked on machines without a GPU.
//
// Include this first, then the .cu files (compiled as C++). Each block's threads are cooperative contexts
// (ucontext) on one OS thread, switched at __syncthreads() and at warp shuffles, which therefore behave as on
// the GPU: a block barrier waits for every live thread of the block, a shuffle for every live lane of the
// warp. Blocks run one after another, so __shared__ variables can be statics and atomics plain read-modify-
// writes. What this cannot show: memory-model races between blocks, timing, anything of the hardware.
// Launches must go through a macro the kernel source lets us define (PD_SAMPLE_LAUNCH).
#pragma once

#define __device__
#define __host__
#define __global__
#define __shared__ static
#define __CUDA_EMULATION__ 1

#include <cuda_runtime.h>  // before the macros below, which would clash with its parameter names
#include <ucontext.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <type_traits>
#include <vector>

#undef __launch_bounds__
#define __launch_bounds__(...)

namespace emu {

// Cooperative context switching: a few instructions on x86-64 (swapcontext makes a system call per switch,
// which dominates a kernel's emulated run time), ucontext elsewhere.
#if defined(__x86_64__)
extern "C" void pd_emu_switch(void** save_sp, void* load_sp);
asm(R"(
    .text
    .globl pd_emu_switch
    .type pd_emu_switch, @function
pd_emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size pd_emu_switch, .-pd_emu_switch
)");

struct Context {
  void* sp = nullptr;
};
inline void switch_to(Context* from, Context* to) {
  pd_emu_switch(&from->sp, to->sp);
}
// A fresh context that calls entry() on `stack`; entry must never return.
inline void make_context(Context* c, std::vector<char>& stack, void (*entry)()) {
  auto top = reinterpret_cast<uintptr_t>(stack.data() + stack.size()) & ~uintptr_t{15};
  auto* sp = reinterpret_cast<void**>(top);
  *--sp = nullptr;                              // alignment: entry starts as if called
  *--sp = reinterpret_cast<void*>(entry);       // ret target
  for (int i = 0; i < 6; ++i) *--sp = nullptr;  // rbp rbx r12 r13 r14 r15
  c->sp = sp;
}
#else
struct Context {
  ucontext_t ctx;
};
inline void switch_to(Context* from, Context* to) {
  swapcontext(&from->ctx, &to->ctx);
}
inline void make_context(Context* c, std::vector<char>& stack, void (*entry)()) {
  getcontext(&c->ctx);
  c->ctx.uc_stack.ss_sp = stack.data();
  c->ctx.uc_stack.ss_size = stack.size();
  c->ctx.uc_link = nullptr;
  makecontext(&c->ctx, entry, 0);
}
#endif

struct Index {
  unsigned int x = 0, y = 0, z = 0;
};

struct Lane {
  Context ctx;
  std::vector<char> stack;
  Index tid;
  bool done = false;
  int wait = 0;    // 0 running, 1 block barrier, 2 warp barrier
  int parity = 0;  // which of the two shuffle slot sets the next shuffle uses
};

struct State {
  std::vector<Lane> lanes;
  Context scheduler;
  int current = 0;
  Index block_idx, grid_dim, block_dim;
  std::function<void()> body;
  uint64_t slots[2][32][32];  // [parity][warp][lane] shuffle exchange
  int64_t launches = 0;       // kernels launched so far
};

inline State& state() {
  static State s;
  return s;
}

inline Lane* current() {
  return &state().lanes[static_cast<size_t>(state().current)];
}

inline void yield_wait(int kind) {
  State& s = state();
  Lane* l = current();
  l->wait = kind;
  switch_to(&l->ctx, &s.scheduler);
}

inline void lane_entry() {
  State& s = state();
  s.body();
  Lane* l = current();
  l->done = true;
  switch_to(&l->ctx, &s.scheduler);
  std::abort();  // a finished lane is never resumed
}

// Runs every lane of the current block until all are done, releasing barriers as they fill.
inline void run_block(int threads) {
  State& s = state();
  const int warps = (threads + 31) / 32;
  for (;;) {
    bool ran = false;
    for (int i = 0; i < threads; ++i) {
      Lane& l = s.lanes[static_cast<size_t>(i)];
      if (l.done || l.wait != 0) continue;
      s.current = i;
      switch_to(&s.scheduler, &l.ctx);
      ran = true;
    }
    if (ran) continue;
    bool all_done = true, block_full = true, released = false;
    for (int i = 0; i < threads; ++i) {
      const Lane& l = s.lanes[static_cast<size_t>(i)];
      if (l.done) continue;
      all_done = false;
      if (l.wait != 1) block_full = false;
    }
    if (all_done) return;
    if (block_full) {
      for (int i = 0; i < threads; ++i) s.lanes[static_cast<size_t>(i)].wait = 0;
      continue;
    }
    for (int w = 0; w < warps; ++w) {
      bool full = true, any = false;
      for (int i = w * 32; i < threads && i < (w + 1) * 32; ++i) {
        const Lane& l = s.lanes[static_cast<size_t>(i)];
        if (l.done) continue;
        any = true;
        if (l.wait != 2) full = false;
      }
      if (any && full) {
        for (int i = w * 32; i < threads && i < (w + 1) * 32; ++i) s.lanes[static_cast<size_t>(i)].wait = 0;
        released = true;
      }
    }
    if (!released) {
      std::fprintf(stderr, "cuda emulation: deadlock (threads wait at different barriers)\n");
      std::abort();
    }
  }
}

inline void launch(dim3 grid, dim3 block, const std::function<void()>& body) {
  State& s = state();
  ++s.launches;
  const int threads = static_cast<int>(block.x * block.y * block.z);
  s.lanes.resize(static_cast<size_t>(threads));
  s.grid_dim = {grid.x, grid.y, grid.z};
  s.block_dim = {block.x, block.y, block.z};
  s.body = body;
  for (unsigned int bz = 0; bz < grid.z; ++bz) {
    for (unsigned int by = 0; by < grid.y; ++by) {
      for (unsigned int bx = 0; bx < grid.x; ++bx) {
        s.block_idx = {bx, by, bz};
        for (int i = 0; i < threads; ++i) {
          Lane& l = s.lanes[static_cast<size_t>(i)];
          l.stack.resize(256 * 1024);
          l.done = false;
          l.wait = 0;
          l.parity = 0;
          l.tid = {static_cast<unsigned int>(i) % block.x, 0, 0};
          make_context(&l.ctx, l.stack, lane_entry);
        }
        run_block(threads);
      }
    }
  }
}

// All live lanes of the warp exchange values. Two slot sets alternate, so one barrier per shuffle suffices:
// a lane can only overwrite its slot of a set after every lane passed the barrier of the shuffle in between.
template <typename T>
T shuffle(T v, int (*src)(int lane, int arg), int arg) {
  static_assert(sizeof(T) <= 8);
  State& s = state();
  Lane* l = current();
  const int me = s.current, warp = me / 32, lane = me % 32, p = l->parity;
  l->parity ^= 1;
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  s.slots[p][warp][lane] = bits;
  yield_wait(2);
  T r;
  std::memcpy(&r, &s.slots[p][warp][src(lane, arg)], sizeof(T));
  return r;
}

}  // namespace emu

#define threadIdx (::emu::current()->tid)
#define blockIdx (::emu::state().block_idx)
#define gridDim (::emu::state().grid_dim)
#define blockDim (::emu::state().block_dim)

inline void __syncthreads() {
  emu::yield_wait(1);
}
inline void __threadfence() {}

template <typename T>
T __shfl_xor_sync(unsigned int, T v, int d) {
  return emu::shuffle(
      v, [](int lane, int arg) { return lane ^ arg; }, d);
}
template <typename T>
T __shfl_up_sync(unsigned int, T v, int d) {
  return emu::shuffle(
      v, [](int lane, int arg) { return lane >= arg ? lane - arg : lane; }, d);
}

template <typename T, typename U>
T atomicAdd(T* p, U v) {
  const T old = *p;
  *p = static_cast<T>(old + static_cast<T>(v));
  return old;
}
template <typename T, typename U>
T atomicMin(T* p, U v) {
  const T old = *p;
  if (static_cast<T>(v) < old) *p = static_cast<T>(v);
  return old;
}
template <typename T, typename U>
T atomicMax(T* p, U v) {
  const T old = *p;
  if (static_cast<T>(v) > old) *p = static_cast<T>(v);
  return old;
}
template <typename T>
T __ldcg(const T* p) {
  return *p;
}
template <typename T>
T min(T a, T b) {
  return b < a ? b : a;
}
template <typename T>
T max(T a, T b) {
  return a < b ? b : a;
}
using std::isnan;

#define PD_SAMPLE_LAUNCH(kernel, grid, block, stream, ...) \
  ::emu::launch(dim3(grid), dim3(block), [&] {             \
    (void)(stream);                                        \
    kernel(__VA_ARGS__);                                   \
  })
