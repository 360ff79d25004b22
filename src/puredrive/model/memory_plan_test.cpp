#include "puredrive/model/memory_plan.h"

#include <gtest/gtest.h>

#include <cmath>

#include "puredrive/model/inspect_report.h"
#include "puredrive/model/loader.h"
#include "puredrive/model/tiny_checkpoint_test_util.h"

namespace pd {
namespace {

const std::string kConfigs = std::string(PD_SOURCE_DIR) + "/tests/fixtures/configs/";

ModelConfig config(const std::string& name) {
  auto c = load_model_config(kConfigs + name);
  EXPECT_TRUE(c.has_value()) << c.status().message();
  return c.has_value() ? *c : ModelConfig{};
}

double floor_tok_s(const MemoryPlan& p, int64_t ctx) {
  return kH200CopyBandwidth / static_cast<double>(p.bytes_per_decode_token(ctx));
}

// Reference counts: transformers 5.17 Qwen3_5MoeForCausalLM / Qwen3NextForCausalLM built on the meta device
// from these config.json files, summing named_parameters() by kind. MTP = one full-attention decoder layer
// counted the same way plus fc (2H x H) and three H-norms (transformers has no MTP module).
TEST(ParamCounts, Qwen35_35B_A3B) {
  const ParamCounts p = count_parameters(config("qwen3.5-35b-a3b"));
  EXPECT_EQ(p.main(), 34660610688);
  EXPECT_EQ(p.embedding, 508559360);
  EXPECT_EQ(p.lm_head, 508559360);
  EXPECT_EQ(p.experts, 32212254720);
  EXPECT_EQ(p.dense, 1431237248);
  EXPECT_EQ(p.mtp, 844640768);
  // docs/DESIGN.md §8: 1.94B dense + 1.01B expert parameters read per token.
  EXPECT_EQ(p.active_experts, 32212254720 / 256 * 8);
  EXPECT_NEAR(p.active_dense / 1e9, 1.94, 0.005);
  EXPECT_NEAR(p.active_experts / 1e9, 1.01, 0.005);
  EXPECT_NEAR(p.total() / 1e9, 35.5, 0.1);  // "35B" on the model card
  EXPECT_NEAR(p.active() / 1e9, 2.95, 0.01);
}

TEST(ParamCounts, Qwen3Next_80B_A3B) {
  ModelConfig c = config("qwen3-next-80b-a3b");
  EXPECT_FALSE(c.mtp_layers_explicit);
  const ParamCounts p = count_parameters(c);
  EXPECT_EQ(p.main(), 79674391296);
  EXPECT_EQ(p.embedding, 311164928);
  EXPECT_EQ(p.experts, 77309411328);
  EXPECT_EQ(p.dense, 1742650112);
  EXPECT_EQ(p.mtp, 0);  // unknown from the config; decided by the checkpoint's mtp.* tensors
  c.mtp_num_hidden_layers = 1;
  EXPECT_EQ(count_parameters(c).mtp, 1650471424);
  EXPECT_EQ(p.active_experts, 77309411328 / 512 * 10);
  EXPECT_NEAR(p.main() / 1e9, 80.0, 0.5);
  EXPECT_NEAR(p.active() / 1e9, 3.56, 0.01);  // "A3B": 2.05B dense + 1.51B experts
}

TEST(MemoryPlan, Qwen35CachesAndStateMatchSpec) {
  const MemoryPlan plan = plan_memory(config("qwen3.5-35b-a3b"), nullptr, 131072);
  EXPECT_FALSE(plan.from_weights);
  EXPECT_EQ(plan.kv_bytes_per_token, 20 * 1024);  // 10 attention layers x 2 KiB (spec §4.4)
  EXPECT_EQ(plan.mtp_kv_bytes_per_token, 2 * 1024);
  EXPECT_EQ(plan.gdn_recurrent_bytes, 30 * 2 * 1024 * 1024);  // 2 MiB fp32 per GDN layer (spec §5.9)
  EXPECT_EQ(plan.gdn_conv_bytes, 30 * 48 * 1024);             // 48 KiB bf16 per GDN layer
  EXPECT_EQ(plan.kv_bytes(), 22 * 1024 * int64_t{131072});
}

TEST(MemoryPlan, Qwen35DecodeFloorMatchesDesign) {
  // docs/DESIGN.md §8: at 4.28 TB/s the floor is 706 tok/s in bf16 at 2K context and 491 at 128K; ~1300 and
  // 720 at 8.5 bits per weight (MLX 8-bit, group 64: 8 + 32/64 bits).
  ModelConfig c = config("qwen3.5-35b-a3b");
  const MemoryPlan bf16 = plan_memory(c, nullptr, 2048);
  EXPECT_EQ(std::lround(floor_tok_s(bf16, 2048)), 706);
  EXPECT_EQ(std::lround(floor_tok_s(bf16, 131072)), 491);
  EXPECT_NEAR((bf16.dense_bytes_per_token + bf16.expert_bytes_per_token) / 2e9, 2.95, 0.01);
  c.quantization = QuantizationConfig{QuantParams{8, 64}, "affine", {}};
  const MemoryPlan q8 = plan_memory(c, nullptr, 2048);
  EXPECT_NEAR(floor_tok_s(q8, 2048), 1300, 13);
  EXPECT_EQ(std::lround(floor_tok_s(q8, 131072)), 720);
  EXPECT_LT(q8.weight_bytes, bf16.weight_bytes * 0.54);
}

TEST(MemoryPlan, Qwen3NextCaches) {
  const MemoryPlan plan = plan_memory(config("qwen3-next-80b-a3b"), nullptr, 4096);
  EXPECT_EQ(plan.kv_bytes_per_token, 24 * 1024);
  EXPECT_EQ(plan.gdn_recurrent_bytes, 72 * 1024 * 1024);
  EXPECT_NEAR(plan.weight_bytes / 1e9, 2 * 79.67, 0.1);
}

TEST(MemoryPlan, RefusesPlanBeyondAvailableMemory) {
  const MemoryPlan plan = plan_memory(config("qwen3.5-35b-a3b"), nullptr, 262144);
  const Status s = check_memory_fits(plan, int64_t{16} << 30, "qwen3.5");
  ASSERT_FALSE(s.is_ok());
  EXPECT_EQ(s.code(), ErrorCode::kOutOfMemory);
  EXPECT_NE(s.message().find("--ctx-size 262144"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("16.00 GiB is available"), std::string::npos) << s.message();
  EXPECT_TRUE(check_memory_fits(plan, plan.total_bytes(), "x").is_ok());
  auto avail = available_memory_bytes();
  ASSERT_TRUE(avail.has_value()) << avail.status().message();
  EXPECT_GT(*avail, 0);
}

TEST(PlanContext, DefaultIsMaxPositionEmbeddingsWhenItFits) {
  const ModelConfig c = config("qwen3.5-35b-a3b");
  ASSERT_EQ(c.max_position_embeddings, 262144);
  const int64_t needed = plan_memory(c, nullptr, 262144).total_bytes();
  auto plan = plan_context(c, nullptr, 0, needed, "qwen3.5");
  ASSERT_TRUE(plan.has_value()) << plan.status().message();
  EXPECT_EQ(plan->ctx_size, 262144);
  EXPECT_EQ(plan->total_bytes(), needed);
}

TEST(PlanContext, DefaultIsLargestContextThatFits) {
  const ModelConfig c = config("qwen3.5-35b-a3b");
  // Expected by hand from the per-token figures: the plan grows by the KV of one token per token.
  const MemoryPlan base = plan_memory(c, nullptr, 1);
  const int64_t per_token = base.kv_bytes_per_token + base.mtp_kv_bytes_per_token;
  ASSERT_GT(per_token, 1);
  const int64_t fixed = base.weight_bytes + base.state_bytes();
  for (const int64_t want : {int64_t{2}, int64_t{3000}, int64_t{100000}, int64_t{262143}}) {
    const int64_t available = fixed + want * per_token + per_token - 1;  // one byte short of want + 1
    auto plan = plan_context(c, nullptr, 0, available, "qwen3.5");
    ASSERT_TRUE(plan.has_value()) << plan.status().message();
    EXPECT_EQ(plan->ctx_size, want) << "available " << available;
    EXPECT_LE(plan->total_bytes(), available);
  }
}

TEST(PlanContext, WeightsThatDoNotFitAreAnErrorNamingTheSizes) {
  const ModelConfig c = config("qwen3.5-35b-a3b");
  const MemoryPlan base = plan_memory(c, nullptr, 2);
  auto plan = plan_context(c, nullptr, 0, base.weight_bytes, "qwen3.5");
  ASSERT_FALSE(plan.has_value());
  EXPECT_EQ(plan.status().code(), ErrorCode::kOutOfMemory);
  const std::string& m = plan.status().message();
  EXPECT_NE(m.find("weights alone need " + format_bytes(static_cast<double>(base.weight_bytes))),
            std::string::npos)
      << m;
  EXPECT_NE(m.find(format_bytes(static_cast<double>(base.weight_bytes)) + " is available"), std::string::npos)
      << m;
}

TEST(PlanContext, ExplicitContextIsHonouredOrRefused) {
  const ModelConfig c = config("qwen3.5-35b-a3b");
  const int64_t available = plan_memory(c, nullptr, 8192).total_bytes();
  auto fits = plan_context(c, nullptr, 8192, available, "qwen3.5");
  ASSERT_TRUE(fits.has_value()) << fits.status().message();
  EXPECT_EQ(fits->ctx_size, 8192);
  // Below max_position_embeddings, yet too large: never silently shrunk.
  auto too_large = plan_context(c, nullptr, 8193, available, "qwen3.5");
  ASSERT_FALSE(too_large.has_value());
  EXPECT_EQ(too_large.status().code(), ErrorCode::kOutOfMemory);
  EXPECT_NE(too_large.status().message().find("--ctx-size 8193"), std::string::npos)
      << too_large.status().message();
  auto one = plan_context(c, nullptr, 1, available, "qwen3.5");
  ASSERT_FALSE(one.has_value());
  EXPECT_EQ(one.status().code(), ErrorCode::kInvalidArgument);
}

TEST(PlanContext, NoMaxPositionEmbeddingsNeedsAnExplicitContext) {
  ModelConfig c = config("qwen3.5-35b-a3b");
  c.max_position_embeddings = 0;
  auto plan = plan_context(c, nullptr, 0, int64_t{1} << 50, "qwen3.5");
  ASSERT_FALSE(plan.has_value());
  EXPECT_NE(plan.status().message().find("pass --ctx-size"), std::string::npos) << plan.status().message();
  auto explicit_ctx = plan_context(c, nullptr, 4096, int64_t{1} << 50, "qwen3.5");
  ASSERT_TRUE(explicit_ctx.has_value()) << explicit_ctx.status().message();
  EXPECT_EQ(explicit_ctx->ctx_size, 4096);
}

TEST(PrefillChunk, LargestThatKeepsTheContext) {
  const ModelConfig c = config("qwen3.5-35b-a3b");
  const int64_t other = 1 << 20;
  // A step workspace grows with its rows, and by more than the hi/lo copies' per-row bytes (a sanity bound
  // computed by hand: 9 x 2048 floats per row for the wgmma products' copies alone).
  const int64_t w2 = step_workspace_bytes(c, 2048, 8), w4 = step_workspace_bytes(c, 4096, 8),
                w8 = step_workspace_bytes(c, 8192, 8);
  EXPECT_EQ(w8 - w4, 2 * (w4 - w2));
  EXPECT_GT(w4 - w2, int64_t{2048} * 9 * 2048 * 4);
  for (const int64_t ctx : {int64_t{0}, int64_t{32768}}) {
    const int64_t plan = plan_memory(c, nullptr, ctx > 0 ? ctx : 262144).total_bytes() + other;
    EXPECT_EQ(choose_prefill_chunk(c, true, ctx, plan + w8, other, 8), 8192) << ctx;
    EXPECT_EQ(choose_prefill_chunk(c, true, ctx, plan + w8 - 1, other, 8), 4096) << ctx;
    EXPECT_EQ(choose_prefill_chunk(c, true, ctx, plan + w4, other, 8), 4096) << ctx;
    EXPECT_EQ(choose_prefill_chunk(c, true, ctx, plan + w4 - 1, other, 8), 2048) << ctx;
    // Too little memory for any: the smallest, and the plan then shrinks the context (or refuses).
    EXPECT_EQ(choose_prefill_chunk(c, true, ctx, plan / 2, other, 8), 2048) << ctx;
    EXPECT_EQ(choose_prefill_chunk(c, false, ctx, int64_t{1} << 50, other, 8), 2048) << ctx;
  }
}

TEST(MemoryPlan, MeasuredOnLoadedWeightsAgreesWithConfigEstimate) {
  testing_util::TempDir dir;
  testing_util::TinySpec spec;
  spec.dtype = DType::kBF16;
  testing_util::TinyCheckpoint ck(spec, dir.path());
  ck.write();
  auto cp = load_checkpoint(dir.path());
  ASSERT_TRUE(cp.has_value()) << cp.status().message();
  const MemoryPlan est = plan_memory(cp->config, nullptr, 100);
  const MemoryPlan got = plan_memory(cp->config, &cp->weights, 100);
  EXPECT_TRUE(got.from_weights);
  EXPECT_EQ(got.weight_bytes, est.weight_bytes);
  EXPECT_EQ(got.dense_bytes_per_token, est.dense_bytes_per_token);
  EXPECT_EQ(got.expert_bytes_per_token, est.expert_bytes_per_token);
  EXPECT_EQ(got.bytes_per_decode_token(100), est.bytes_per_decode_token(100));
}

TEST(MemoryPlan, MeasuredOnQuantizedWeightsAgreesWithConfigEstimate) {
  testing_util::TempDir dir;
  testing_util::TinySpec spec;
  spec.dtype = DType::kBF16;
  spec.quant_bits = 4;
  spec.bits_by_suffix = {{"mlp.gate", 8}, {"switch_mlp.down_proj", 6}, {"lm_head", 3}};
  spec.experts = testing_util::Experts::kSwitchMlp;
  spec.mtp_experts = testing_util::Experts::kSwitchMlp;
  spec.mlx_layout = true;
  testing_util::TinyCheckpoint ck(spec, dir.path());
  ck.write();
  auto cp = load_checkpoint(dir.path());
  ASSERT_TRUE(cp.has_value()) << cp.status().message();
  const MemoryPlan est = plan_memory(cp->config, nullptr, 10);
  const MemoryPlan got = plan_memory(cp->config, &cp->weights, 10);
  EXPECT_EQ(got.weight_bytes, est.weight_bytes);
  EXPECT_EQ(got.dense_bytes_per_token, est.dense_bytes_per_token);
  EXPECT_EQ(got.expert_bytes_per_token, est.expert_bytes_per_token);
  // One 4-bit g32 expert projection [32, 64]: 32 * 64 * (4 + 32/32) / 8 bytes.
  EXPECT_EQ(cp->weights.layers[0].moe.gate_proj[0].nbytes(), 32 * 64 * 5 / 8);
}

TEST(Inspect, ConfigOnlyReport) {
  const ModelConfig c = config("qwen3.5-35b-a3b");
  const InspectInput in{
      .dir = kConfigs + "qwen3.5-35b-a3b", .config = &c, .checkpoint = nullptr, .ctx_size = 2048};
  const auto j = inspect_json(in);
  EXPECT_EQ(j["weights"], "config-only");
  EXPECT_EQ(j["layers"]["full_attention"], 10);
  EXPECT_EQ(j["layers"]["linear_attention"], 30);
  EXPECT_EQ(j["layers"]["mtp"], 1);
  EXPECT_EQ(j["params"]["main"].get<int64_t>(), 34660610688);
  EXPECT_EQ(std::lround(j["decode"]["at_ctx_size"]["floor_tokens_per_s"].get<double>()), 706);
  EXPECT_EQ(j["layer_plan"].get<std::string>().substr(0, 22), "GDN GDN GDN ATTN GDN G");
  const std::string text = inspect_text(in);
  EXPECT_NE(text.find("active per token 2.95B = 1.94B dense + 1.01B experts"), std::string::npos) << text;
  EXPECT_NE(text.find("706 tok/s"), std::string::npos) << text;
}

}  // namespace
}  // namespace pd
