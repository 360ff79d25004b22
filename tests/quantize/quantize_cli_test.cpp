// `puredrive quantize` through the binary: the bundled tiny coder (bf16, fused experts, an MTP head)
// converted with oq6e passes `puredrive check` on the CPU (speculative decoding with the quantized MTP head
// gives the same tokens as plain decoding), `inspect` reports the recipe's bits per weight, and bad input
// fails with a message.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "cli_run.h"

namespace pd {
namespace {

namespace fs = std::filesystem;

using test::CliRun;

CliRun run(const std::string& args) {
  return test::run_cli(args, true);
}

fs::path temp_dir(const std::string& tag) {
  return fs::temp_directory_path() / fmt::format("pd_quantize_cli_{}_{}", tag, static_cast<long>(::getpid()));
}

// The optimized build converts the trained tiny coder; unoptimized (sanitizer) builds, where a check of the
// tiny coder would take many minutes, convert the random bf16 fixture, which has the same expert-width
// property (down_proj's input width is not a multiple of 64).
#ifdef NDEBUG
constexpr bool kTinyCoder = true;
#else
constexpr bool kTinyCoder = false;
#endif

TEST(QuantizeCli, Oq6ePassesCheck) {
  const fs::path out = temp_dir("oq6e");
  fs::remove_all(out);
  const std::string model =
      std::string(PD_SOURCE_DIR) + (kTinyCoder ? "/models/tiny-coder" : "/tests/fixtures/qwen35-bf16");
  // The nested qwen3_5_moe fixture is written with mlx-lm's `language_model.` prefix.
  const std::string prefix = kTinyCoder ? "" : "language_model.";
  const CliRun q =
      run(fmt::format("quantize --model {} --out {} --recipe oq6e --threads 2", model, out.string()));
  std::printf("%s\n", q.out.c_str());
  ASSERT_EQ(q.rc, 0) << q.out;
  EXPECT_NE(q.out.find("quantize: "), std::string::npos) << "progress line";
  EXPECT_NE(q.out.find("the output loads"), std::string::npos);
  for (const char* f :
       {"config.json", "model.safetensors", "model.safetensors.index.json", "generation_config.json"}) {
    EXPECT_TRUE(fs::exists(out / f)) << f;
  }
  if (kTinyCoder) {
    EXPECT_TRUE(fs::exists(out / "tokenizer.json"));
    EXPECT_TRUE(fs::exists(out / "tokenizer_config.json"));
  }

  const CliRun c =
      run(fmt::format("check --model {} --threads 1 --tokens {}", out.string(), kTinyCoder ? 32 : 16));
  std::printf("%s\n", c.out.c_str());
  EXPECT_EQ(c.rc, 0) << c.out;
  EXPECT_NE(c.out.find("check PASSED"), std::string::npos) << c.out;
  EXPECT_EQ(c.out.find("FAIL"), std::string::npos) << c.out;
  EXPECT_NE(c.out.find("greedy identity"), std::string::npos);

  const CliRun i = run(fmt::format("inspect --model {} --json", out.string()));
  ASSERT_EQ(i.rc, 0) << i.out;
  const auto j = nlohmann::json::parse(i.out.substr(i.out.find('{')));
  const auto& bpw = j["bits_per_weight"];
  // 8-bit codes + a bf16 scale and bias per 64 weights = 8.5 bits; 6-bit: 6.5.
  EXPECT_DOUBLE_EQ(bpw["attention"]["bits_per_weight"].get<double>(), 8.5);
  EXPECT_DOUBLE_EQ(bpw["gdn"]["bits_per_weight"].get<double>(), 8.5);
  EXPECT_DOUBLE_EQ(bpw["embedding"]["bits_per_weight"].get<double>(), 8.5);
  EXPECT_DOUBLE_EQ(bpw["lm_head"]["bits_per_weight"].get<double>(), 8.5);
  EXPECT_DOUBLE_EQ(bpw["router"]["bits_per_weight"].get<double>(), 8.5);
  // Routed experts: gate and up 6-bit; down_proj's input width (moe_intermediate_size 32) is not a multiple
  // of 64, so it stays bf16 (16 bits), as mlx-lm leaves it: (6.5 + 6.5 + 16) / 3.
  EXPECT_NEAR(bpw["routed_experts"]["bits_per_weight"].get<double>(), 29.0 / 3.0, 1e-9);
  const auto& q8 = j["quantization"];
  EXPECT_EQ(q8["bits"], 8);
  EXPECT_EQ(q8["overrides"][prefix + "mtp.layers.0.mlp.switch_mlp.gate_proj"]["bits"], 6);
  EXPECT_EQ(q8["overrides"][prefix + "model.layers.3.mlp.gate"]["bits"], 8);
  fs::remove_all(out);
}

TEST(QuantizeCli, BadInputFailsWithAMessage) {
  const fs::path out = temp_dir("bad");
  fs::remove_all(out);
  const std::string fixtures = std::string(PD_SOURCE_DIR) + "/tests/fixtures";
  const CliRun already =
      run(fmt::format("quantize --model {}/qwen35-mlx-q --out {} --recipe q4", fixtures, out.string()));
  EXPECT_EQ(already.rc, 1) << already.out;
  EXPECT_NE(already.out.find("already"), std::string::npos) << already.out;
  const CliRun recipe =
      run(fmt::format("quantize --model {}/qwen35-bf16 --out {} --recipe q3", fixtures, out.string()));
  EXPECT_NE(recipe.rc, 0) << recipe.out;
  const CliRun group = run(fmt::format(
      "quantize --model {}/qwen35-bf16 --out {} --recipe oq6e --group-size 32", fixtures, out.string()));
  EXPECT_EQ(group.rc, 1) << group.out;
  EXPECT_NE(group.out.find("group size 64"), std::string::npos) << group.out;
  const CliRun missing =
      run(fmt::format("quantize --model {}/nope --out {} --recipe q8", fixtures, out.string()));
  EXPECT_EQ(missing.rc, 1) << missing.out;
  EXPECT_NE(missing.out.find("puredrive quantize:"), std::string::npos) << missing.out;
  fs::remove_all(out);
}

}  // namespace
}  // namespace pd
