// Test helpers for the CPU op tests: random data, matrices in every stored format (with an independent
// bit-by-bit affine packer and decoder), backend tensors from host vectors, and comparisons.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "puredrive/backend/backend.h"
#include "puredrive/backend/cpu/cpu_backend.h"
#include "puredrive/checkpoint/weights.h"
#include "puredrive/util/dtype.h"

namespace pd::test {

inline std::vector<float> random_vector(std::mt19937& rng, size_t n, float scale = 1.0f) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// A matrix that owns its storage. `reference` holds the exact f32 values the stored format represents,
// decoded independently of the backend's kernels.
struct OwnedMatrix {
  std::vector<uint8_t> data, scales, biases;
  std::vector<float> reference;  // [rows, cols]
  Matrix m;
};

inline std::unique_ptr<OwnedMatrix> make_matrix(std::mt19937& rng, int64_t rows, int64_t cols, WeightFormat f,
                                                int bits = 4, int group_size = 32, float scale = 0.5f,
                                                DType scale_dtype = DType::kBF16) {
  auto o = std::make_unique<OwnedMatrix>();
  std::vector<float> w = random_vector(rng, static_cast<size_t>(rows * cols), scale);
  o->reference.resize(w.size());
  o->m.format = f;
  o->m.rows = rows;
  o->m.cols = cols;
  o->m.name = "test";
  switch (f) {
    case WeightFormat::kF32:
      o->data.resize(w.size() * 4);
      std::memcpy(o->data.data(), w.data(), o->data.size());
      o->reference = w;
      break;
    case WeightFormat::kBF16:
    case WeightFormat::kF16: {
      o->data.resize(w.size() * 2);
      auto* p = reinterpret_cast<uint16_t*>(o->data.data());
      for (size_t i = 0; i < w.size(); ++i) {
        p[i] = f == WeightFormat::kBF16 ? f32_to_bf16(w[i]) : f32_to_f16(w[i]);
        o->reference[i] = f == WeightFormat::kBF16 ? bf16_to_f32(p[i]) : f16_to_f32(p[i]);
      }
      break;
    }
    case WeightFormat::kAffine: {
      const int64_t groups = cols / group_size;
      const int64_t words = cols * bits / 32;
      o->data.assign(static_cast<size_t>(rows * words * 4), 0);
      const size_t ssize = dtype_size(scale_dtype);
      o->scales.resize(static_cast<size_t>(rows * groups) * ssize);
      o->biases.resize(o->scales.size());
      std::uniform_int_distribution<uint32_t> code_dist(0, (1u << bits) - 1u);
      auto put = [&](std::vector<uint8_t>& dst, int64_t i, float v) -> float {
        if (scale_dtype == DType::kF32) {
          std::memcpy(dst.data() + i * 4, &v, 4);
          return v;
        }
        const uint16_t h = scale_dtype == DType::kBF16 ? f32_to_bf16(v) : f32_to_f16(v);
        std::memcpy(dst.data() + i * 2, &h, 2);
        return scale_dtype == DType::kBF16 ? bf16_to_f32(h) : f16_to_f32(h);
      };
      auto* packed = reinterpret_cast<uint32_t*>(o->data.data());
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t g = 0; g < groups; ++g) {
          const float s = put(o->scales, r * groups + g,
                              scale * (0.01f + 0.1f * std::abs(w[static_cast<size_t>(r * cols + g)])));
          const float b = put(o->biases, r * groups + g,
                              -scale * 0.5f + 0.1f * w[static_cast<size_t>(r * cols + g * group_size + 1)]);
          for (int64_t j = g * group_size; j < (g + 1) * group_size; ++j) {
            const uint32_t q = code_dist(rng);
            // Bit-by-bit little-endian stream: code j occupies bits [j*bits, (j+1)*bits) of the row.
            for (int bit = 0; bit < bits; ++bit) {
              const int64_t pos = j * bits + bit;
              if ((q >> bit) & 1u) packed[r * words + pos / 32] |= 1u << (pos % 32);
            }
            o->reference[static_cast<size_t>(r * cols + j)] = s * static_cast<float>(q) + b;
          }
        }
      }
      o->m.bits = bits;
      o->m.group_size = group_size;
      o->m.scale_dtype = scale_dtype;
      o->m.scales = o->scales.data();
      o->m.biases = o->biases.data();
      break;
    }
  }
  o->m.data = o->data.data();
  return o;
}

inline std::unique_ptr<Backend> cpu_backend(int threads) {
  return make_cpu_backend(BackendOptions{.name = "cpu", .threads = threads, .min_parallel_work = 0});
}

template <typename T>
Buffer device_tensor(Backend& be, DType dtype, int64_t rows, int64_t cols, const std::vector<T>& host) {
  Expected<Buffer> b = be.alloc(dtype, rows, cols);
  EXPECT_TRUE(b.has_value());
  if (!host.empty()) {
    EXPECT_TRUE(be.upload(b->tensor(), host.data()).is_ok());
  }
  return std::move(b).value();
}

inline std::vector<float> to_host(Backend& be, const Tensor& t) {
  std::vector<float> out(static_cast<size_t>(t.rows * t.cols));
  EXPECT_TRUE(be.download(out.data(), t).is_ok());
  return out;
}

// max |a - b| / max |ref|.
inline double rel_err(const std::vector<float>& a, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num = std::max(num, std::abs(static_cast<double>(a[i]) - ref[i]));
    den = std::max(den, std::abs(ref[i]));
  }
  return den == 0 ? num : num / den;
}

inline bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace pd::test
