#include "puredrive/model/quantize.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <set>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "puredrive/checkpoint/affine.h"
#include "puredrive/model/loader.h"
#include "puredrive/util/mapped_file.h"

namespace pd {
namespace {

namespace fs = std::filesystem;

std::string source_path(const std::string& rel) {
  return std::string(PD_SOURCE_DIR) + "/" + rel;
}

std::vector<float> to_floats(const TensorInfo& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = load_scale(t.data, t.dtype, static_cast<int64_t>(i));
  return v;
}

// tests/fixtures/mlx-quantize holds mx.quantize's own output (mlx 0.32.4, CPU) for every bit width, group
// size and input dtype (tools/quantize/make_mlx_reference.py); ours must match it byte for byte.
TEST(QuantizeMlx, ByteIdenticalToMlxReference) {
  auto f =
      SafetensorsFile::open(source_path("tests/fixtures/mlx-quantize/mlx_quantize_reference.safetensors"));
  ASSERT_TRUE(f.has_value()) << f.status().message();
  std::map<std::string, const TensorInfo*> by;
  for (const auto& t : f->tensors()) by[t.name] = &t;
  int compared = 0;
  for (const auto& [dname, dtype] :
       {std::pair{"bf16", DType::kBF16}, {"f16", DType::kF16}, {"f32", DType::kF32}}) {
    const TensorInfo* w = by.at(std::string("w.") + dname);
    ASSERT_EQ(w->dtype, dtype);
    const std::vector<float> wf = to_floats(*w);
    const int64_t rows = w->shape[0], cols = w->shape[1];
    for (int bits : {2, 3, 4, 5, 6, 8}) {
      for (int group : {32, 64, 128}) {
        const std::string key = fmt::format("{}.b{}.g{}", dname, bits, group);
        auto q = quantize_affine_mlx(wf.data(), rows, cols, bits, group, dtype);
        ASSERT_TRUE(q.has_value()) << q.status().message();
        const TensorInfo* rw = by.at(key + ".weight");
        const TensorInfo* rs = by.at(key + ".scales");
        const TensorInfo* rb = by.at(key + ".biases");
        ASSERT_EQ(rw->dtype, DType::kU32);
        ASSERT_EQ(rs->dtype, dtype);
        ASSERT_EQ(rw->nbytes, q->codes.size() * 4) << key;
        ASSERT_EQ(rs->nbytes, q->scales.size()) << key;
        EXPECT_EQ(std::memcmp(rw->data, q->codes.data(), rw->nbytes), 0) << key << " codes";
        EXPECT_EQ(std::memcmp(rs->data, q->scales.data(), rs->nbytes), 0) << key << " scales";
        EXPECT_EQ(std::memcmp(rb->data, q->biases.data(), rb->nbytes), 0) << key << " biases";
        ++compared;
      }
    }
  }
  EXPECT_EQ(compared, 54);
}

// Values worked out by hand from MLX's rule (mlx/backend/cpu/quantized.cpp), with exactly representable
// steps.
TEST(QuantizeMlx, HandComputedGroups) {
  std::vector<float> w(64);
  // Group 0: min -15 dominates: scale = 15/15 = 1, q0 = rint(-15/1) = -15, bias = -15, q = w + 15.
  for (int j = 0; j < 32; ++j) w[j] = -static_cast<float>(j % 16);
  // Group 1: max 30 dominates: scale = -30/15 = -2, bias = 30, q = rint((30 - w) / 2), ties to even.
  for (int j = 0; j < 32; ++j) w[32 + j] = static_cast<float>(j % 31);
  auto q = quantize_affine_mlx(w.data(), 1, 64, 4, 32, DType::kF32);
  ASSERT_TRUE(q.has_value());
  EXPECT_EQ(load_scale(q->scales.data(), DType::kF32, 0), 1.0f);
  EXPECT_EQ(load_scale(q->biases.data(), DType::kF32, 0), -15.0f);
  EXPECT_EQ(load_scale(q->scales.data(), DType::kF32, 1), -2.0f);
  EXPECT_EQ(load_scale(q->biases.data(), DType::kF32, 1), 30.0f);
  for (int j = 0; j < 32; ++j)
    EXPECT_EQ(affine_code(q->codes.data(), 4, j), 15u - static_cast<uint32_t>(j % 16));
  const uint32_t expect1[] = {15, 14, 14, 14, 13, 12, 12, 12, 11, 10, 10, 10, 9, 8, 8, 8,
                              7,  6,  6,  6,  5,  4,  4,  4,  3,  2,  2,  2,  1, 0, 0, 15};
  for (int j = 0; j < 32; ++j) EXPECT_EQ(affine_code(q->codes.data(), 4, 32 + j), expect1[j]) << j;

  // All-zero group: q0 = 0, so bias 0 and scale -1e-7; a constant group c: scale c / rint(c / -1e-7), bias c.
  std::vector<float> z(64, 0.0f);
  for (int j = 32; j < 64; ++j) z[j] = 0.75f;
  auto qz = quantize_affine_mlx(z.data(), 1, 64, 2, 32, DType::kF32);
  ASSERT_TRUE(qz.has_value());
  EXPECT_EQ(load_scale(qz->scales.data(), DType::kF32, 0), -1e-7f);
  EXPECT_EQ(load_scale(qz->biases.data(), DType::kF32, 0), 0.0f);
  EXPECT_EQ(load_scale(qz->biases.data(), DType::kF32, 1), 0.75f);
  EXPECT_EQ(load_scale(qz->scales.data(), DType::kF32, 1), 0.75f / std::nearbyint(0.75f / -1e-7f));
  std::vector<float> back(64);
  qz->view().dequantize_row(0, back.data());
  for (int j = 0; j < 64; ++j) EXPECT_EQ(back[j], z[j]);
}

// Bound of |dequantised - original| for one element under MLX's rule. Codes inside the range are within half
// a step |s|. The far end can lie outside it: the scale is snapped so that the edge hits a code exactly (s =
// edge / q0), which can leave the opposite end up to one step beyond 2^bits - 1, where it is clamped; so
// elements with the top code are within one step. Stored bf16 scales and biases add their rounding.
float mlx_error_bound(float s, float b, uint32_t code, int bits, DType sd) {
  const float top = static_cast<float>((1 << bits) - 1);
  const float rounding = sd == DType::kF32 ? 1e-6f * (std::fabs(s) * top + std::fabs(b)) + 1e-30f
                                           : 0x1p-8f * (std::fabs(s) * top + std::fabs(b));
  return (code == static_cast<uint32_t>(top) ? 1.0001f : 0.5f) * std::fabs(s) + rounding;
}

TEST(QuantizeMlx, RoundTripThroughTheAffineReader) {
  std::mt19937 rng(18);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int64_t rows = 16, cols = 256;
  std::vector<float> w(static_cast<size_t>(rows * cols));
  for (auto& x : w) x = nd(rng) * (1.0f + static_cast<float>(rng() % 100));
  for (int bits : {2, 3, 4, 5, 6, 8}) {
    for (int group : {32, 64, 128}) {
      for (DType sd : {DType::kF32, DType::kBF16}) {
        auto q = quantize_affine_mlx(w.data(), rows, cols, bits, group, sd);
        ASSERT_TRUE(q.has_value());
        const Matrix m = q->view("w");
        std::vector<float> row(static_cast<size_t>(cols));
        int64_t within_half_step = 0;
        for (int64_t r = 0; r < rows; ++r) {
          m.dequantize_row(r, row.data());
          const uint32_t* codes = q->codes.data() + r * affine_packed_cols(cols, bits);
          for (int64_t j = 0; j < cols; ++j) {
            const int64_t g = r * (cols / group) + j / group;
            const float s = load_scale(q->scales.data(), sd, g);
            const float b = load_scale(q->biases.data(), sd, g);
            const float err = std::fabs(row[j] - w[static_cast<size_t>(r * cols + j)]);
            ASSERT_LE(err, mlx_error_bound(s, b, affine_code(codes, bits, j), bits, sd))
                << "bits " << bits << " group " << group << " r " << r << " j " << j;
            within_half_step += err <= mlx_error_bound(s, b, 0, bits, sd) ? 1 : 0;
          }
        }
        // Only group ends can be clamped.
        EXPECT_GE(within_half_step, rows * cols - 2 * rows * (cols / group)) << bits << " " << group;
      }
    }
  }
}

TEST(QuantizeRecipe, ClassesAndWidths) {
  EXPECT_EQ(classify_module("model.embed_tokens"), ModuleClass::kEmbedding);
  EXPECT_EQ(classify_module("lm_head"), ModuleClass::kLmHead);
  EXPECT_EQ(classify_module("mtp.fc"), ModuleClass::kMtpFc);
  EXPECT_EQ(classify_module("model.layers.3.self_attn.o_proj"), ModuleClass::kAttention);
  EXPECT_EQ(classify_module("model.layers.0.linear_attn.in_proj_qkvz"), ModuleClass::kGdn);
  EXPECT_EQ(classify_module("model.layers.0.linear_attn.out_proj"), ModuleClass::kGdn);
  EXPECT_EQ(classify_module("model.layers.0.mlp.gate"), ModuleClass::kRouter);
  EXPECT_EQ(classify_module("mtp.layers.0.mlp.shared_expert_gate"), ModuleClass::kRouter);
  EXPECT_EQ(classify_module("model.layers.0.mlp.shared_expert.down_proj"), ModuleClass::kSharedExpert);
  EXPECT_EQ(classify_module("model.layers.0.mlp.switch_mlp.up_proj"), ModuleClass::kRoutedExperts);
  EXPECT_EQ(classify_module("model.layers.0.mlp.experts.gate_up_proj"), ModuleClass::kRoutedExperts);
  EXPECT_EQ(classify_module("mtp.layers.0.mlp.experts.17.down_proj"), ModuleClass::kRoutedExperts);
  EXPECT_EQ(classify_module("model.layers.0.mlp.experts.x.down_proj"), ModuleClass::kOther);
  EXPECT_EQ(classify_module("model.layers.0.self_attn.q_norm"), ModuleClass::kOther);
  EXPECT_EQ(classify_module("model.layers.0.linear_attn.conv1d"), ModuleClass::kOther);
  EXPECT_EQ(classify_module("model.norm"), ModuleClass::kOther);

  const QuantParams router = recipe_params(QuantRecipe::kQ4, 32, ModuleClass::kRouter);
  EXPECT_EQ(router.bits, 8);
  EXPECT_EQ(router.group_size, 64);
  EXPECT_EQ(recipe_params(QuantRecipe::kQ5, 128, ModuleClass::kAttention).bits, 5);
  EXPECT_EQ(recipe_params(QuantRecipe::kQ5, 128, ModuleClass::kAttention).group_size, 128);
  EXPECT_EQ(recipe_params(QuantRecipe::kOq6e, 64, ModuleClass::kRoutedExperts).bits, 6);
  for (ModuleClass c : {ModuleClass::kEmbedding, ModuleClass::kLmHead, ModuleClass::kAttention,
                        ModuleClass::kGdn, ModuleClass::kSharedExpert, ModuleClass::kMtpFc}) {
    EXPECT_EQ(recipe_params(QuantRecipe::kOq6e, 64, c).bits, 8) << module_class_name(c);
  }
  EXPECT_FALSE(parse_quant_recipe("q3").has_value());
  EXPECT_EQ(*parse_quant_recipe("oq6e"), QuantRecipe::kOq6e);
}

// The plan for the nested bf16 fixture: mlx-lm's names and layout, the MTP head kept in the same layout.
TEST(QuantizePlan, NestedBf16FixtureLayout) {
  const std::string dir = source_path("tests/fixtures/qwen35-bf16");
  auto config = load_model_config(dir);
  ASSERT_TRUE(config.has_value());
  auto store = TensorStore::open_dir(dir);
  ASSERT_TRUE(store.has_value());
  auto plan = plan_quantization(*config, *store, QuantRecipe::kOq6e, 64);
  ASSERT_TRUE(plan.has_value()) << plan.status().message();
  std::map<std::string, const PlannedTensor*> by;
  for (const auto& t : plan->tensors) by[t.name] = &t;
  const int64_t E = config->num_experts, I = config->moe_intermediate_size, H = config->hidden_size;
  for (const std::string p : {"language_model.model.layers.0.mlp.", "language_model.mtp.layers.0.mlp."}) {
    // [E, I, H] experts stacked and quantized 6-bit along H (64 wide: one group).
    const PlannedTensor* g = by.at(p + "switch_mlp.gate_proj.weight");
    EXPECT_EQ(g->dtype, DType::kU32);
    EXPECT_EQ(g->shape, (std::vector<int64_t>{E, I, H * 6 / 32}));
    EXPECT_EQ(by.at(p + "switch_mlp.up_proj.scales")->shape, (std::vector<int64_t>{E, I, H / 64}));
    EXPECT_EQ(by.at(p + "switch_mlp.gate_proj.scales")->dtype, DType::kBF16);
    // down_proj's input width I = 16 is not a multiple of 64: mlx-lm leaves it in float, stacked.
    EXPECT_EQ(by.at(p + "switch_mlp.down_proj.weight")->dtype, DType::kBF16);
    EXPECT_EQ(by.at(p + "switch_mlp.down_proj.weight")->shape, (std::vector<int64_t>{E, H, I}));
    EXPECT_EQ(by.count(p + "switch_mlp.down_proj.scales"), 0u);
    EXPECT_EQ(by.at(p + "gate.weight")->shape, (std::vector<int64_t>{E, H * 8 / 32}));
    EXPECT_EQ(plan->overrides.at(p + "gate").bits, 8);
    EXPECT_EQ(plan->overrides.at(p + "shared_expert_gate").group_size, 64);
    EXPECT_EQ(plan->overrides.at(p + "switch_mlp.gate_proj").bits, 6);
  }
  EXPECT_EQ(plan->global.bits, 8);
  EXPECT_EQ(plan->global.group_size, 64);
  // 8-bit modules at the global width are not listed, as mlx-lm writes the block.
  EXPECT_EQ(plan->overrides.count("language_model.model.layers.3.self_attn.q_proj"), 0u);
  EXPECT_EQ(by.at("language_model.model.layers.3.self_attn.q_proj.weight")->dtype, DType::kU32);
  EXPECT_EQ(by.at("language_model.model.embed_tokens.scales")->shape,
            (std::vector<int64_t>{config->vocab_size, H / 64}));
  EXPECT_EQ(by.at("language_model.lm_head.weight")->dtype, DType::kU32);
  EXPECT_EQ(by.at("language_model.mtp.fc.weight")->dtype, DType::kU32);
  // conv1d [C, 1, K] -> [C, K, 1]; norms and A_log stay float in their dtypes.
  const int64_t C = config->conv_dim(), K = config->linear_conv_kernel_dim;
  EXPECT_EQ(by.at("language_model.model.layers.0.linear_attn.conv1d.weight")->shape,
            (std::vector<int64_t>{C, K, 1}));
  EXPECT_EQ(by.at("language_model.model.layers.0.linear_attn.A_log")->dtype, DType::kF32);
  EXPECT_EQ(by.at("language_model.model.norm.weight")->dtype, DType::kBF16);
  for (const auto& t : plan->tensors) {
    EXPECT_EQ(t.name.find("visual"), std::string::npos) << t.name;
    EXPECT_EQ(t.name.find("experts."), std::string::npos) << t.name;
  }
}

TEST(QuantizePlan, RefusesQuantizedInputAndBadGroups) {
  const std::string dir = source_path("tests/fixtures/qwen35-mlx-q");
  auto config = load_model_config(dir);
  ASSERT_TRUE(config.has_value());
  auto store = TensorStore::open_dir(dir);
  ASSERT_TRUE(store.has_value());
  auto plan = plan_quantization(*config, *store, QuantRecipe::kQ4, 64);
  ASSERT_FALSE(plan.has_value());
  EXPECT_NE(plan.status().message().find("already"), std::string::npos) << plan.status().message();
  const std::string fdir = source_path("tests/fixtures/qwen35-bf16");
  auto fc = load_model_config(fdir);
  auto fs_ = TensorStore::open_dir(fdir);
  ASSERT_TRUE(fc.has_value() && fs_.has_value());
  EXPECT_FALSE(plan_quantization(*fc, *fs_, QuantRecipe::kQ4, 48).has_value());
}

// Every matrix of `q` (quantized checkpoint) against the same matrix of `f` (its float source), through the
// loader's own views: within half a quantization step of the group, plus the bf16 rounding of scale and bias.
void expect_close(const Matrix& f, const Matrix& q, int* quantized, const std::string& what) {
  ASSERT_EQ(f.rows, q.rows) << what;
  ASSERT_EQ(f.cols, q.cols) << what;
  if (q.format != WeightFormat::kAffine) {
    std::vector<float> a(static_cast<size_t>(f.cols)), b(a.size());
    for (int64_t r = 0; r < f.rows; ++r) {
      f.dequantize_row(r, a.data());
      q.dequantize_row(r, b.data());
      ASSERT_EQ(a, b) << what << " row " << r;
    }
    return;
  }
  ++*quantized;
  const int64_t groups = q.cols / q.group_size;
  std::vector<float> a(static_cast<size_t>(f.cols)), b(a.size());
  for (int64_t r = 0; r < f.rows; ++r) {
    f.dequantize_row(r, a.data());
    q.dequantize_row(r, b.data());
    const uint32_t* codes = static_cast<const uint32_t*>(q.data) + r * affine_packed_cols(q.cols, q.bits);
    for (int64_t k = 0; k < f.cols; ++k) {
      const float s = load_scale(q.scales, q.scale_dtype, r * groups + k / q.group_size);
      const float bias = load_scale(q.biases, q.scale_dtype, r * groups + k / q.group_size);
      ASSERT_LE(std::fabs(a[static_cast<size_t>(k)] - b[static_cast<size_t>(k)]),
                mlx_error_bound(s, bias, affine_code(codes, q.bits, k), q.bits, q.scale_dtype))
          << what << " row " << r << " col " << k;
    }
  }
}

// Zero-centred norms: the float checkpoint stores w (the loader adds 1 in f32); the output stores 1 + w
// rounded once to the checkpoint's dtype.
bool g_bf16_norms = false;

void expect_norm_close(const std::vector<float>& f, const std::vector<float>& q, const std::string& what) {
  ASSERT_EQ(f.size(), q.size()) << what;
  for (size_t i = 0; i < f.size(); ++i)
    EXPECT_EQ(q[i], g_bf16_norms ? round_to_bf16(f[i]) : f[i]) << what << " " << i;
}

void expect_layer_close(const LayerWeights& f, const LayerWeights& q, int* n, const std::string& p) {
  expect_norm_close(f.input_layernorm, q.input_layernorm, p + "input_layernorm");
  expect_norm_close(f.post_attention_layernorm, q.post_attention_layernorm, p + "post_attention_layernorm");
  if (f.type == LayerType::kFullAttention) {
    expect_close(f.attn.q_proj, q.attn.q_proj, n, p + "q_proj");
    expect_close(f.attn.k_proj, q.attn.k_proj, n, p + "k_proj");
    expect_close(f.attn.v_proj, q.attn.v_proj, n, p + "v_proj");
    expect_close(f.attn.o_proj, q.attn.o_proj, n, p + "o_proj");
    expect_norm_close(f.attn.q_norm, q.attn.q_norm, p + "q_norm");
  } else {
    expect_close(f.gdn.in_proj_qkv, q.gdn.in_proj_qkv, n, p + "in_proj_qkv");
    expect_close(f.gdn.in_proj_z, q.gdn.in_proj_z, n, p + "in_proj_z");
    expect_close(f.gdn.in_proj_b, q.gdn.in_proj_b, n, p + "in_proj_b");
    expect_close(f.gdn.in_proj_a, q.gdn.in_proj_a, n, p + "in_proj_a");
    expect_close(f.gdn.out_proj, q.gdn.out_proj, n, p + "out_proj");
    EXPECT_EQ(f.gdn.conv1d, q.gdn.conv1d) << p;
    EXPECT_EQ(f.gdn.A_log, q.gdn.A_log) << p;
    EXPECT_EQ(f.gdn.dt_bias, q.gdn.dt_bias) << p;
    EXPECT_EQ(f.gdn.norm, q.gdn.norm) << p << " (linear_attn.norm is never shifted)";
  }
  expect_close(f.moe.gate, q.moe.gate, n, p + "gate");
  expect_close(f.moe.shared_expert_gate, q.moe.shared_expert_gate, n, p + "shared_expert_gate");
  expect_close(f.moe.shared_gate_proj, q.moe.shared_gate_proj, n, p + "shared_gate_proj");
  expect_close(f.moe.shared_down_proj, q.moe.shared_down_proj, n, p + "shared_down_proj");
  ASSERT_EQ(f.moe.gate_proj.size(), q.moe.gate_proj.size());
  for (size_t e = 0; e < f.moe.gate_proj.size(); ++e) {
    expect_close(f.moe.gate_proj[e], q.moe.gate_proj[e], n, p + fmt::format("expert {} gate", e));
    expect_close(f.moe.up_proj[e], q.moe.up_proj[e], n, p + fmt::format("expert {} up", e));
    expect_close(f.moe.down_proj[e], q.moe.down_proj[e], n, p + fmt::format("expert {} down", e));
  }
}

class QuantizeCheckpoint : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(QuantizeCheckpoint, WritesALoadableCheckpointCloseToTheSource) {
  const auto [fixture, recipe_name] = GetParam();
  const std::string in = source_path("tests/fixtures/" + fixture);
  const fs::path out = fs::temp_directory_path() / fmt::format("pd_quantize_test_{}_{}_{}", fixture,
                                                               recipe_name, static_cast<long>(::getpid()));
  fs::remove_all(out);
  QuantizeOptions o;
  o.model_dir = in;
  o.out_dir = out.string();
  o.recipe = *parse_quant_recipe(recipe_name);
  o.group_size = recipe_name == "q4" ? 32 : 64;
  o.threads = 3;
  o.max_shard_bytes = 200 << 10;  // several shards even for a tiny model
  int progress_calls = 0;
  QuantizeProgress last;
  o.progress = [&](const QuantizeProgress& p) {
    ++progress_calls;
    EXPECT_LE(p.jobs_done, p.jobs_total);
    EXPECT_LE(p.bytes_done, p.bytes_total);
    last = p;
  };
  auto sum = quantize_checkpoint(o);
  ASSERT_TRUE(sum.has_value()) << sum.status().message();
  g_bf16_norms = fixture == "qwen35-bf16";
  EXPECT_GT(progress_calls, 0);
  EXPECT_EQ(last.jobs_done, last.jobs_total);
  EXPECT_EQ(last.bytes_done, last.bytes_total) << "the last report is 100%";
  EXPECT_GT(sum->files.size(), 1u);
  EXPECT_LT(sum->output_bytes, sum->input_bytes);
  EXPECT_TRUE(fs::exists(out / "generation_config.json"));
  auto fcp = load_checkpoint(in);
  auto qcp = load_checkpoint(out.string(), LoadOptions{.load_mtp = true, .error_on_unused = true});
  ASSERT_TRUE(fcp.has_value()) << fcp.status().message();
  ASSERT_TRUE(qcp.has_value()) << qcp.status().message();
  ASSERT_TRUE(qcp->config.quantization.has_value());
  EXPECT_TRUE(qcp->norms_shifted_in_file);
  EXPECT_EQ(qcp->expert_layout, "switch_mlp");
  const ModelWeights& f = fcp->weights;
  const ModelWeights& q = qcp->weights;
  int quantized = 0;
  expect_close(f.embed_tokens, q.embed_tokens, &quantized, "embed_tokens");
  expect_close(f.lm_head, q.lm_head, &quantized, "lm_head");
  expect_norm_close(f.norm, q.norm, "norm");
  ASSERT_EQ(f.layers.size(), q.layers.size());
  for (size_t i = 0; i < f.layers.size(); ++i) {
    expect_layer_close(f.layers[i], q.layers[i], &quantized, fmt::format("layer {} ", i));
  }
  ASSERT_TRUE(f.mtp.has_value());
  ASSERT_TRUE(q.mtp.has_value()) << "the MTP head must be kept";
  expect_close(f.mtp->fc, q.mtp->fc, &quantized, "mtp.fc");
  EXPECT_EQ(q.mtp->fc.format, WeightFormat::kAffine);
  expect_norm_close(f.mtp->pre_fc_norm_embedding, q.mtp->pre_fc_norm_embedding, "mtp.pre_fc_norm_embedding");
  expect_norm_close(f.mtp->pre_fc_norm_hidden, q.mtp->pre_fc_norm_hidden, "mtp.pre_fc_norm_hidden");
  expect_norm_close(f.mtp->norm, q.mtp->norm, "mtp.norm");
  expect_layer_close(f.mtp->layers[0], q.mtp->layers[0], &quantized, "mtp layer ");
  EXPECT_GT(quantized, 10);
  // Widths as the recipe says.
  const bool oq6e = recipe_name == "oq6e";
  EXPECT_EQ(q.layers[0].moe.gate_proj[0].bits, oq6e ? 6 : 4);
  EXPECT_EQ(q.mtp->layers[0].moe.up_proj[1].bits, oq6e ? 6 : 4);
  EXPECT_EQ(q.layers[0].moe.gate.bits, 8);
  EXPECT_EQ(q.layers[0].moe.gate.group_size, 64);
  EXPECT_EQ(q.embed_tokens.bits, oq6e ? 8 : 4);
  fs::remove_all(out);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, QuantizeCheckpoint,
                         ::testing::Values(std::tuple{std::string("qwen35-bf16"), std::string("oq6e")},
                                           std::tuple{std::string("qwen3next-f32"), std::string("q4")},
                                           std::tuple{std::string("qwen35-text-f32"), std::string("oq6e")}),
                         [](const auto& i) {
                           std::string s = std::get<0>(i.param) + "_" + std::get<1>(i.param);
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

std::string file_bytes(const fs::path& p) {
  auto text = read_text_file(p.string());
  EXPECT_TRUE(text.has_value()) << p;
  return text ? *text : std::string();
}

// Jobs run in whatever order the threads take them, each writing its own bytes in place: the files must not
// depend on the thread count. Both expert layouts (fused, and per-expert tensors stacked into switch_mlp).
TEST(QuantizeCheckpoint, SameBytesForAnyThreadCount) {
  for (const auto& [fixture, recipe] : {std::pair{"qwen35-bf16", "oq6e"}, {"qwen3next-f32", "q4"}}) {
    std::vector<fs::path> outs;
    for (int threads : {1, 2, 5}) {
      outs.push_back(fs::temp_directory_path() / fmt::format("pd_quantize_threads_{}_{}_{}", fixture, threads,
                                                             static_cast<long>(::getpid())));
      fs::remove_all(outs.back());
      QuantizeOptions o;
      o.model_dir = source_path(std::string("tests/fixtures/") + fixture);
      o.out_dir = outs.back().string();
      o.recipe = *parse_quant_recipe(recipe);
      o.threads = threads;
      o.max_shard_bytes = 200 << 10;
      auto sum = quantize_checkpoint(o);
      ASSERT_TRUE(sum.has_value()) << sum.status().message();
      EXPECT_EQ(sum->threads, threads);
      EXPECT_GT(sum->files.size(), 1u) << "several shards";
      EXPECT_GT(sum->read_bytes, 0u);
      EXPECT_LE(sum->read_bytes, sum->input_bytes);
    }
    std::set<std::string> names;
    for (const auto& e : fs::directory_iterator(outs[0])) names.insert(e.path().filename().string());
    for (size_t k = 1; k < outs.size(); ++k) {
      std::set<std::string> other;
      for (const auto& e : fs::directory_iterator(outs[k])) other.insert(e.path().filename().string());
      EXPECT_EQ(names, other) << fixture;
      for (const auto& n : names) {
        EXPECT_TRUE(file_bytes(outs[0] / n) == file_bytes(outs[k] / n)) << fixture << " " << n << " differs";
      }
    }
    for (const auto& d : outs) fs::remove_all(d);
  }
}

TEST(QuantizeCheckpoint, RefusesOutEqualToModelAndMissingInput) {
  QuantizeOptions o;
  o.model_dir = source_path("tests/fixtures/qwen35-bf16");
  o.out_dir = o.model_dir;
  auto same = quantize_checkpoint(o);
  ASSERT_FALSE(same.has_value());
  EXPECT_NE(same.status().message().find("--out"), std::string::npos);
  o.model_dir = source_path("tests/fixtures/does-not-exist");
  o.out_dir = (fs::temp_directory_path() / "pd_quantize_never_written").string();
  EXPECT_FALSE(quantize_checkpoint(o).has_value());
  EXPECT_FALSE(fs::exists(o.out_dir));
}

}  // namespace
}  // namespace pd
