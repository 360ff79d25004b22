#include "puredrive/model/loader.h"

#include <gtest/gtest.h>

#include "puredrive/model/tiny_checkpoint_test_util.h"

namespace pd {
namespace {

using testing_util::Experts;
using testing_util::StoredTensor;
using testing_util::TempDir;
using testing_util::TinyCheckpoint;
using testing_util::TinySpec;

std::vector<float> row_of(const Matrix& m, int64_t r) {
  std::vector<float> out(static_cast<size_t>(m.cols));
  m.dequantize_row(r, out.data());
  return out;
}

// Every row of `m` equals row (offset + i) of the stored tensor.
void expect_rows(const Matrix& m, const StoredTensor& t, int64_t offset, const std::string& what) {
  ASSERT_EQ(m.cols, t.shape.back()) << what;
  for (int64_t r = 0; r < m.rows; ++r) ASSERT_EQ(row_of(m, r), t.row(offset + r)) << what << " row " << r;
}

std::vector<float> plus_one(const std::vector<float>& v) {
  std::vector<float> out = v;
  for (auto& x : out) x += 1.0f;
  return out;
}

Checkpoint load_ok(const std::string& dir, const LoadOptions& o = {}) {
  auto cp = load_checkpoint(dir, o);
  EXPECT_TRUE(cp.has_value()) << cp.status().message();
  if (!cp.has_value()) return {};
  return std::move(cp).value();
}

TEST(TensorNames, Canonical) {
  EXPECT_EQ(canonical_tensor_name("model.language_model.layers.3.mlp.gate.weight"),
            "model.layers.3.mlp.gate.weight");
  EXPECT_EQ(canonical_tensor_name("language_model.model.embed_tokens.weight"), "model.embed_tokens.weight");
  EXPECT_EQ(canonical_tensor_name("language_model.lm_head.scales"), "lm_head.scales");
  EXPECT_EQ(canonical_tensor_name("lm_head.weight"), "lm_head.weight");
  EXPECT_EQ(canonical_tensor_name("model.layers.0.input_layernorm.weight"),
            "model.layers.0.input_layernorm.weight");
  EXPECT_EQ(canonical_tensor_name("mtp.fc.weight"), "mtp.fc.weight");
  EXPECT_EQ(canonical_tensor_name("model.language_model.mtp.norm.weight"), "mtp.norm.weight");
  EXPECT_EQ(canonical_tensor_name("language_model.mtp.layers.0.mlp.gate.weight"),
            "mtp.layers.0.mlp.gate.weight");
  EXPECT_EQ(canonical_tensor_name("model.visual.blocks.0.attn.qkv.weight"), "");
  EXPECT_EQ(canonical_tensor_name("vision_tower.patch_embed.proj.weight"), "");
  EXPECT_EQ(canonical_tensor_name("something.else"), "something.else");
}

// Qwen3.5 as published by Qwen: nested config, model.language_model.*, fused experts, per-expert MTP experts,
// vision tower, HF norms (w stored, 1 + w used).
TEST(Loader, Qwen35HfLayout) {
  TempDir dir;
  TinySpec spec;
  spec.vision = true;
  spec.dtype = DType::kBF16;
  TinyCheckpoint ck(spec, dir.path());
  ck.write();
  Checkpoint cp = load_ok(dir.path());
  const auto& d = ck.dims();
  const ModelWeights& w = cp.weights;
  ASSERT_EQ(w.layers.size(), 4u);
  EXPECT_EQ(cp.expert_layout, "fused");
  EXPECT_FALSE(cp.norms_shifted_in_file);
  EXPECT_TRUE(cp.unused.empty()) << cp.unused.front();
  ASSERT_EQ(cp.notices.size(), 1u);
  EXPECT_NE(cp.notices[0].find("skipped 2 vision-tower tensors"), std::string::npos);
  EXPECT_EQ(cp.config.mtp_num_hidden_layers, 1);

  const std::string p = "model.language_model.";
  expect_rows(w.embed_tokens, ck.at(p + "embed_tokens.weight"), 0, "embed");
  EXPECT_EQ(w.embed_tokens.format, WeightFormat::kBF16);
  expect_rows(w.lm_head, ck.at("lm_head.weight"), 0, "lm_head");
  EXPECT_EQ(w.norm, plus_one(ck.at(p + "norm.weight").values));
  for (int i = 0; i < 4; ++i) {
    const std::string l = p + "layers." + std::to_string(i) + ".";
    const LayerWeights& lw = w.layers[i];
    EXPECT_EQ(lw.type, ck.is_full(i) ? LayerType::kFullAttention : LayerType::kLinearAttention);
    EXPECT_EQ(lw.input_layernorm, plus_one(ck.at(l + "input_layernorm.weight").values));
    EXPECT_EQ(lw.post_attention_layernorm, plus_one(ck.at(l + "post_attention_layernorm.weight").values));
    if (ck.is_full(i)) {
      expect_rows(lw.attn.q_proj, ck.at(l + "self_attn.q_proj.weight"), 0, "q_proj");
      EXPECT_EQ(lw.attn.q_proj.rows, d.Hq * d.D * 2);
      expect_rows(lw.attn.o_proj, ck.at(l + "self_attn.o_proj.weight"), 0, "o_proj");
      EXPECT_EQ(lw.attn.k_norm, plus_one(ck.at(l + "self_attn.k_norm.weight").values));
    } else {
      const std::string a = l + "linear_attn.";
      expect_rows(lw.gdn.in_proj_qkv, ck.at(a + "in_proj_qkv.weight"), 0, "qkv");
      expect_rows(lw.gdn.in_proj_a, ck.at(a + "in_proj_a.weight"), 0, "a");
      EXPECT_EQ(lw.gdn.conv1d, ck.at(a + "conv1d.weight").values);
      EXPECT_EQ(lw.gdn.norm, ck.at(a + "norm.weight").values);  // never shifted
      EXPECT_EQ(lw.gdn.A_log, ck.at(a + "A_log").values);
      EXPECT_EQ(lw.gdn.dt_bias, ck.at(a + "dt_bias").values);
    }
    // Fused experts: gate = first I rows of gate_up_proj[e], up = the next I; down_proj[e] is [H, I].
    const auto& gu = ck.at(l + "mlp.experts.gate_up_proj");
    const auto& dn = ck.at(l + "mlp.experts.down_proj");
    ASSERT_EQ(lw.moe.gate_proj.size(), static_cast<size_t>(d.E));
    for (int64_t e = 0; e < d.E; ++e) {
      expect_rows(lw.moe.gate_proj[e], gu, e * 2 * d.I, "gate e" + std::to_string(e));
      expect_rows(lw.moe.up_proj[e], gu, e * 2 * d.I + d.I, "up e" + std::to_string(e));
      expect_rows(lw.moe.down_proj[e], dn, e * d.H, "down e" + std::to_string(e));
      EXPECT_EQ(lw.moe.gate_proj[e].rows, d.I);
      // Views into the mapping, not copies.
      EXPECT_EQ(static_cast<const uint8_t*>(lw.moe.up_proj[e].data) -
                    static_cast<const uint8_t*>(lw.moe.gate_proj[0].data),
                (e * 2 * d.I + d.I) * d.H * 2);
    }
    expect_rows(lw.moe.shared_expert_gate, ck.at(l + "mlp.shared_expert_gate.weight"), 0, "shared gate");
    expect_rows(lw.moe.gate, ck.at(l + "mlp.gate.weight"), 0, "router");
  }
  ASSERT_TRUE(w.mtp.has_value());
  const MtpWeights& m = *w.mtp;
  expect_rows(m.fc, ck.at("mtp.fc.weight"), 0, "fc");
  EXPECT_EQ(m.pre_fc_norm_embedding, plus_one(ck.at("mtp.pre_fc_norm_embedding.weight").values));
  EXPECT_EQ(m.norm, plus_one(ck.at("mtp.norm.weight").values));
  ASSERT_EQ(m.layers.size(), 1u);
  EXPECT_EQ(m.layers[0].type, LayerType::kFullAttention);
  for (int64_t e = 0; e < d.E; ++e) {
    const std::string b = "mtp.layers.0.mlp.experts." + std::to_string(e) + ".";
    expect_rows(m.layers[0].moe.gate_proj[e], ck.at(b + "gate_proj.weight"), 0, "mtp gate");
    expect_rows(m.layers[0].moe.down_proj[e], ck.at(b + "down_proj.weight"), 0, "mtp down");
  }
  EXPECT_EQ(m.layers[0].attn.q_norm, plus_one(ck.at("mtp.layers.0.self_attn.q_norm.weight").values));

  // The listing covers every stored tensor.
  size_t vision = 0;
  for (const auto& t : cp.tensors) {
    EXPECT_NE(t.format, "UNUSED") << t.name;
    vision += t.format == "ignored (vision tower)" ? 1 : 0;
  }
  EXPECT_EQ(vision, 2u);
  EXPECT_EQ(cp.tensors.size(), ck.stored().size());
}

// mlx-lm / mlx-vlm after sanitize: language_model.model.*, switch_mlp experts, conv [C, K, 1], norms already
// 1 + w, MLX affine with mixed bits (8-bit routers as mlx-lm writes, 6-bit down_proj, a float lm_head).
TEST(Loader, MlxQuantizedMixedBits) {
  TempDir dir;
  TinySpec spec;
  spec.main_prefix = "language_model.model.";
  spec.head_name = "language_model.lm_head.weight";
  spec.mtp_prefix = "language_model.mtp.";
  spec.experts = Experts::kSwitchMlp;
  spec.mtp_experts = Experts::kSwitchMlp;
  spec.mlx_layout = true;
  spec.dtype = DType::kBF16;
  spec.quant_bits = 4;
  spec.group_size = 32;
  spec.bits_by_suffix = {{"mlp.gate", 8},
                         {"shared_expert_gate", 8},
                         {"switch_mlp.down_proj", 6},
                         {"in_proj_b", 3},
                         {"lm_head", 0},
                         {"self_attn.v_proj", 5},
                         {"in_proj_a", 2}};
  spec.vision = true;
  TinyCheckpoint ck(spec, dir.path());
  ck.write();
  Checkpoint cp = load_ok(dir.path());
  const auto& d = ck.dims();
  const ModelWeights& w = cp.weights;
  EXPECT_TRUE(cp.norms_shifted_in_file);
  EXPECT_EQ(cp.expert_layout, "switch_mlp");
  EXPECT_TRUE(cp.unused.empty());
  const std::string p = "language_model.model.";
  EXPECT_EQ(w.norm, ck.at(p + "norm.weight").values);  // stored 1 + w, used as is
  EXPECT_EQ(w.embed_tokens.format, WeightFormat::kAffine);
  EXPECT_EQ(w.embed_tokens.bits, 4);
  expect_rows(w.embed_tokens, ck.at(p + "embed_tokens.weight"), 0, "embed");
  EXPECT_EQ(w.lm_head.format, WeightFormat::kBF16);
  for (int i = 0; i < 4; ++i) {
    const std::string l = p + "layers." + std::to_string(i) + ".";
    const LayerWeights& lw = w.layers[i];
    EXPECT_EQ(lw.input_layernorm, ck.at(l + "input_layernorm.weight").values);
    EXPECT_EQ(lw.moe.gate.bits, 8);
    EXPECT_EQ(lw.moe.shared_expert_gate.bits, 8);
    EXPECT_EQ(lw.moe.shared_gate_proj.bits, 4);
    EXPECT_EQ(lw.moe.gate.scale_dtype, DType::kBF16);
    expect_rows(lw.moe.gate, ck.at(l + "mlp.gate.weight"), 0, "router");
    for (int64_t e = 0; e < d.E; ++e) {
      EXPECT_EQ(lw.moe.down_proj[e].bits, 6);
      EXPECT_EQ(lw.moe.gate_proj[e].bits, 4);
      EXPECT_EQ(lw.moe.gate_proj[e].group_size, 32);
      expect_rows(lw.moe.gate_proj[e], ck.at(l + "mlp.switch_mlp.gate_proj.weight"), e * d.I, "gate");
      expect_rows(lw.moe.up_proj[e], ck.at(l + "mlp.switch_mlp.up_proj.weight"), e * d.I, "up");
      expect_rows(lw.moe.down_proj[e], ck.at(l + "mlp.switch_mlp.down_proj.weight"), e * d.H, "down");
    }
    if (ck.is_full(i)) {
      EXPECT_EQ(lw.attn.v_proj.bits, 5);
      expect_rows(lw.attn.v_proj, ck.at(l + "self_attn.v_proj.weight"), 0, "v_proj");
      EXPECT_EQ(lw.attn.q_norm, ck.at(l + "self_attn.q_norm.weight").values);
    } else {
      EXPECT_EQ(lw.gdn.in_proj_b.bits, 3);
      EXPECT_EQ(lw.gdn.in_proj_a.bits, 2);
      expect_rows(lw.gdn.in_proj_b, ck.at(l + "linear_attn.in_proj_b.weight"), 0, "b");
      expect_rows(lw.gdn.in_proj_a, ck.at(l + "linear_attn.in_proj_a.weight"), 0, "a");
      EXPECT_EQ(lw.gdn.conv1d, ck.at(l + "linear_attn.conv1d.weight").values);
    }
  }
  ASSERT_TRUE(w.mtp.has_value());
  EXPECT_EQ(w.mtp->norm, ck.at("language_model.mtp.norm.weight").values);
  EXPECT_EQ(w.mtp->layers[0].moe.gate.bits, 8);
  expect_rows(w.mtp->fc, ck.at("language_model.mtp.fc.weight"), 0, "fc");
  // The listing names formats.
  bool saw = false;
  for (const auto& t : cp.tensors) {
    if (t.name == p + "layers.0.mlp.gate.scales") {
      EXPECT_EQ(t.format, "affine q8 g32 scales");
      saw = true;
    }
  }
  EXPECT_TRUE(saw);
}

// Independent statement of spec §5.1: output row o of the contiguous q|k|v (or z, b, a) comes from the
// grouped row computed here head by head.
struct NextIndex {
  int64_t Hk, Hv, dk, dv;
  int64_t r() const { return Hv / Hk; }
  int64_t group() const { return 2 * dk + 2 * r() * dv; }
  int64_t qkv(int64_t o) const {
    const int64_t kd = Hk * dk;
    if (o < kd) return (o / dk) * group() + o % dk;                         // q of key head o / dk
    if (o < 2 * kd) return ((o - kd) / dk) * group() + dk + (o - kd) % dk;  // k
    const int64_t vh = (o - 2 * kd) / dv, g = vh / r(), j = vh % r();       // value head vh of key head g
    return g * group() + 2 * dk + j * dv + (o - 2 * kd) % dv;
  }
  int64_t z(int64_t o) const {
    const int64_t vh = o / dv, g = vh / r(), j = vh % r();
    return g * group() + 2 * dk + r() * dv + j * dv + o % dv;
  }
  int64_t b(int64_t h) const { return (h / r()) * 2 * r() + h % r(); }
  int64_t a(int64_t h) const { return (h / r()) * 2 * r() + r() + h % r(); }
};

void check_next_reorder(const Checkpoint& cp, const TinyCheckpoint& ck) {
  const auto& d = ck.dims();
  const NextIndex ix{d.Hk, d.Hv, d.dk, d.dv};
  for (int i = 0; i < 4; ++i) {
    if (ck.is_full(i)) continue;
    const std::string a = "model.layers." + std::to_string(i) + ".linear_attn.";
    const GdnWeights& g = cp.weights.layers[i].gdn;
    const auto& qkvz = ck.at(a + "in_proj_qkvz.weight");
    const auto& ba = ck.at(a + "in_proj_ba.weight");
    ASSERT_EQ(g.in_proj_qkv.rows, d.conv_dim());
    ASSERT_EQ(g.in_proj_z.rows, d.value_dim());
    for (int64_t o = 0; o < d.conv_dim(); ++o)
      ASSERT_EQ(row_of(g.in_proj_qkv, o), qkvz.row(ix.qkv(o))) << "qkv " << o;
    for (int64_t o = 0; o < d.value_dim(); ++o)
      ASSERT_EQ(row_of(g.in_proj_z, o), qkvz.row(ix.z(o))) << "z " << o;
    for (int64_t h = 0; h < d.Hv; ++h) {
      ASSERT_EQ(row_of(g.in_proj_b, h), ba.row(ix.b(h))) << "b " << h;
      ASSERT_EQ(row_of(g.in_proj_a, h), ba.row(ix.a(h))) << "a " << h;
    }
  }
}

TEST(Loader, Qwen3NextFusedQkvzReorder) {
  TempDir dir;
  TinySpec spec;
  spec.model_type = "qwen3_next";
  spec.main_prefix = "model.";
  spec.experts = Experts::kPerExpert;
  spec.fused_qkvz = true;
  spec.mtp_in_config = false;  // qwen3_next configs omit it; the mtp.* tensors decide
  spec.shards = 3;
  TinyCheckpoint ck(spec, dir.path());
  ck.write();
  Checkpoint cp = load_ok(dir.path());
  EXPECT_EQ(cp.config.arch, Arch::kQwen3Next);
  EXPECT_EQ(cp.expert_layout, "per-expert");
  EXPECT_EQ(cp.config.mtp_num_hidden_layers, 1);
  ASSERT_TRUE(cp.weights.mtp.has_value());
  EXPECT_TRUE(cp.unused.empty());
  check_next_reorder(cp, ck);
  for (int64_t e = 0; e < ck.dims().E; ++e) {
    const std::string b = "model.layers.0.mlp.experts." + std::to_string(e) + ".";
    expect_rows(cp.weights.layers[0].moe.up_proj[e], ck.at(b + "up_proj.weight"), 0, "up");
  }
}

TEST(Loader, Qwen3NextQuantizedQkvzReorder) {
  TempDir dir;
  TinySpec spec;
  spec.model_type = "qwen3_next";
  spec.main_prefix = "model.";
  spec.experts = Experts::kSwitchMlp;
  spec.mtp_prefix = "";  // mlx-lm drops mtp.*
  spec.fused_qkvz = true;
  spec.mlx_layout = true;
  spec.dtype = DType::kBF16;
  spec.quant_bits = 3;
  spec.bits_by_suffix = {{"in_proj_ba", 5}};
  TinyCheckpoint ck(spec, dir.path());
  ck.write();
  Checkpoint cp = load_ok(dir.path());
  EXPECT_EQ(cp.weights.layers[0].gdn.in_proj_qkv.bits, 3);
  EXPECT_EQ(cp.weights.layers[0].gdn.in_proj_b.bits, 5);
  check_next_reorder(cp, ck);
  // The config says 1 MTP layer but the checkpoint has none: a notice, no head.
  EXPECT_FALSE(cp.weights.mtp.has_value());
  EXPECT_EQ(cp.config.mtp_num_hidden_layers, 0);
  ASSERT_EQ(cp.notices.size(), 1u);
  EXPECT_NE(cp.notices[0].find("no mtp.* tensors"), std::string::npos);
}

TEST(Loader, QwenNextOrderMatchesIndependentFormula) {
  const NextIndex ix{16, 32, 128, 128};
  const QkvzOrder o = qwen3_next_qkvz_order(16, 32, 128, 128);
  ASSERT_EQ(o.qkv.size(), 8192u);
  ASSERT_EQ(o.z.size(), 4096u);
  for (size_t i = 0; i < o.qkv.size(); ++i) ASSERT_EQ(o.qkv[i], ix.qkv(static_cast<int64_t>(i))) << i;
  for (size_t i = 0; i < o.z.size(); ++i) ASSERT_EQ(o.z[i], ix.z(static_cast<int64_t>(i))) << i;
  for (int64_t h = 0; h < 32; ++h) {
    EXPECT_EQ(o.b[h], ix.b(h));
    EXPECT_EQ(o.a[h], ix.a(h));
  }
}

TEST(Loader, Qwen35MtpUnderLanguageModelPrefixAndFusedMtpExperts) {
  TempDir dir;
  TinySpec spec;
  spec.mtp_prefix = "model.language_model.mtp.";
  spec.mtp_experts = Experts::kFused;  // Qwen3.6 layout
  spec.experts = Experts::kPerExpert;
  TinyCheckpoint ck(spec, dir.path());
  ck.write();
  Checkpoint cp = load_ok(dir.path());
  ASSERT_TRUE(cp.weights.mtp.has_value());
  const auto& gu = ck.at("model.language_model.mtp.layers.0.mlp.experts.gate_up_proj");
  expect_rows(cp.weights.mtp->layers[0].moe.up_proj[2], gu, 2 * 2 * ck.dims().I + ck.dims().I, "mtp up");
  EXPECT_EQ(cp.weights.mtp->pre_fc_norm_hidden,
            plus_one(ck.at("model.language_model.mtp.pre_fc_norm_hidden.weight").values));
  EXPECT_EQ(cp.expert_layout, "per-expert");
}

TEST(Loader, TiedEmbeddingsAndSkippedMtp) {
  TempDir dir;
  TinySpec spec;
  spec.model_type = "qwen3_5_moe_text";
  spec.main_prefix = "model.";
  spec.tie = true;
  TinyCheckpoint ck(spec, dir.path());
  ck.write();
  LoadOptions o;
  o.load_mtp = false;
  o.error_on_unused = true;  // skipped MTP tensors are not "unused"
  Checkpoint cp = load_ok(dir.path(), o);
  EXPECT_EQ(cp.weights.lm_head.data, cp.weights.embed_tokens.data);
  EXPECT_FALSE(cp.weights.mtp.has_value());
  EXPECT_EQ(cp.config.mtp_num_hidden_layers, 0);
  for (const auto& t : cp.tensors) {
    if (t.name.rfind("mtp.", 0) == 0) {
      EXPECT_EQ(t.format, "ignored (MTP not loaded)");
    }
  }
}

TEST(Loader, ForcedNormLayout) {
  TempDir dir;
  TinySpec spec;
  spec.model_type = "qwen3_5_moe_text";
  spec.main_prefix = "model.";
  TinyCheckpoint ck(spec, dir.path());
  ck.write();
  LoadOptions o;
  o.norm_layout = NormLayout::kMlxSanitized;  // trust the file: no +1
  Checkpoint cp = load_ok(dir.path(), o);
  EXPECT_EQ(cp.weights.norm, ck.at("model.norm.weight").values);
  ASSERT_TRUE(cp.weights.mtp.has_value());
  EXPECT_EQ(cp.weights.mtp->norm, ck.at("mtp.norm.weight").values);
  o.norm_layout = NormLayout::kHf;
  cp = load_ok(dir.path(), o);
  EXPECT_EQ(cp.weights.norm, plus_one(ck.at("model.norm.weight").values));
}

class LoaderErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    TinySpec spec;
    spec.model_type = "qwen3_5_moe_text";
    spec.main_prefix = "model.";
    build(spec);
  }
  void build(const TinySpec& spec) {
    ck_ = std::make_unique<TinyCheckpoint>(spec, dir_.path());
    ck_->write();
  }
  // Rewrites model.safetensors through `edit` (which gets the stored tensors and a writer to fill).
  void rewrite(const std::function<void(const TensorStore&, SafetensorsWriter&)>& edit) {
    auto store = TensorStore::open_dir(dir_.path());
    ASSERT_TRUE(store.has_value());
    SafetensorsWriter w;
    edit(*store, w);
    const std::string image = w.serialize();
    store = Expected<TensorStore>(make_error(ErrorCode::kInternal, "closed"));
    testing_util::write_text(dir_.file("model.safetensors"), image);
  }
  void copy_except(const TensorStore& s, SafetensorsWriter& w, const std::string& skip) {
    for (const auto& t : s.tensors()) {
      if (t.name != skip) {
        ASSERT_TRUE(w.add(t.name, t.dtype, t.shape, t.data, t.nbytes).is_ok());
      }
    }
  }
  void expect_load_error(std::initializer_list<const char*> fragments, const LoadOptions& o = {}) {
    auto cp = load_checkpoint(dir_.path(), o);
    ASSERT_FALSE(cp.has_value());
    for (const char* f : fragments) {
      EXPECT_NE(cp.status().message().find(f), std::string::npos)
          << cp.status().message() << "\nmissing: " << f;
    }
  }
  TempDir dir_;
  std::unique_ptr<TinyCheckpoint> ck_;
};

TEST_F(LoaderErrors, MissingTensorNamesItAndTheShape) {
  rewrite([&](const TensorStore& s, SafetensorsWriter& w) {
    copy_except(s, w, "model.layers.1.self_attn.k_proj.weight");
  });
  expect_load_error({"missing tensor 'model.layers.1.self_attn.k_proj.weight'", "expected shape [32, 64]"});
}

TEST_F(LoaderErrors, WrongShapeNamesExpectedAndActual) {
  rewrite([&](const TensorStore& s, SafetensorsWriter& w) {
    const std::string name = "model.layers.0.linear_attn.out_proj.weight";
    copy_except(s, w, name);
    ASSERT_TRUE(w.add_f32(name, DType::kF32, {64, 32}, std::vector<float>(64 * 32)).is_ok());
  });
  expect_load_error({"tensor 'model.layers.0.linear_attn.out_proj.weight'", "expected shape [64, 64]",
                     "file has [64, 32]"});
}

TEST_F(LoaderErrors, MissingExperts) {
  rewrite([&](const TensorStore& s, SafetensorsWriter& w) {
    for (const auto& t : s.tensors()) {
      if (t.name.find("layers.2.mlp.experts.") == std::string::npos) {
        ASSERT_TRUE(w.add(t.name, t.dtype, t.shape, t.data, t.nbytes).is_ok());
      }
    }
  });
  expect_load_error({"no routed experts for 'model.layers.2.mlp'", "experts.gate_up_proj"});
}

TEST_F(LoaderErrors, UnusedTensorsWarnOrFail) {
  rewrite([&](const TensorStore& s, SafetensorsWriter& w) {
    copy_except(s, w, "");
    ASSERT_TRUE(w.add_f32("model.layers.9.mystery.weight", DType::kF32, {2}, {1, 2}).is_ok());
  });
  Checkpoint cp = load_ok(dir_.path());
  ASSERT_EQ(cp.unused, std::vector<std::string>{"model.layers.9.mystery.weight"});
  LoadOptions strict;
  strict.error_on_unused = true;
  expect_load_error({"1 tensors are not used by the model: model.layers.9.mystery.weight"}, strict);
}

TEST_F(LoaderErrors, ConflictingNames) {
  rewrite([&](const TensorStore& s, SafetensorsWriter& w) {
    copy_except(s, w, "");
    const TensorInfo* t = s.find("model.norm.weight");
    ASSERT_TRUE(w.add("model.language_model.norm.weight", t->dtype, t->shape, t->data, t->nbytes).is_ok());
  });
  expect_load_error({"both name 'model.norm.weight'"});
}

TEST_F(LoaderErrors, MixedConvLayouts) {
  rewrite([&](const TensorStore& s, SafetensorsWriter& w) {
    const std::string name = "model.layers.2.linear_attn.conv1d.weight";
    copy_except(s, w, name);
    const TensorInfo* t = s.find(name);
    ASSERT_TRUE(w.add(name, t->dtype, {t->shape[0], t->shape[2], 1}, t->data, t->nbytes).is_ok());
  });
  expect_load_error({"model.layers.2.linear_attn.conv1d.weight", "mixed layouts are refused"});
}

TEST_F(LoaderErrors, QuantizationDisagreesWithConfig) {
  TinySpec spec;
  spec.model_type = "qwen3_5_moe_text";
  spec.main_prefix = "model.";
  spec.quant_bits = 4;
  spec.bits_by_suffix = {{"mlp.gate", 8}};
  build(spec);
  // Drop the per-module overrides: the config now claims 4 bits for the 8-bit routers.
  auto cfg = ck_->config();
  nlohmann::json q = {{"bits", 4}, {"group_size", 32}};
  cfg["quantization"] = q;
  cfg.erase("quantization_config");
  testing_util::write_text(dir_.file("config.json"), cfg.dump());
  expect_load_error(
      {"'model.layers.0.mlp.gate'", "config.json says 4-bit group 32, the tensor shapes say 8-bit group 32"});
  // A module the config keeps in float must not carry scales.
  q["model.layers.0.mlp.gate"] = false;
  cfg["quantization"] = q;
  testing_util::write_text(dir_.file("config.json"), cfg.dump());
  expect_load_error({"config.json keeps 'model.layers.0.mlp.gate' in float"});
}

TEST_F(LoaderErrors, QuantizedWithoutBiases) {
  TinySpec spec;
  spec.model_type = "qwen3_5_moe_text";
  spec.main_prefix = "model.";
  spec.quant_bits = 4;
  build(spec);
  rewrite([&](const TensorStore& s, SafetensorsWriter& w) {
    copy_except(s, w, "model.layers.3.self_attn.o_proj.biases");
  });
  expect_load_error(
      {"'model.layers.3.self_attn.o_proj.scales' exists but 'model.layers.3.self_attn.o_proj.biases' is "
       "missing"});
}

TEST_F(LoaderErrors, NoWeights) {
  std::filesystem::remove(dir_.file("model.safetensors"));
  auto cp = load_checkpoint(dir_.path());
  ASSERT_FALSE(cp.has_value());
  EXPECT_EQ(cp.status().code(), ErrorCode::kNotFound);
}

}  // namespace
}  // namespace pd
