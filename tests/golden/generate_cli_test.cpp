// `puredrive generate` end to end on the fixtures: the greedy ids it prints equal transformers' greedy
// continuation, the JSON reports the peak resident set (printed to the test log), and a model whose memory
// plan exceeds the available memory is refused with a clear message before anything is loaded; --mtp-adaptive
// on and off give the same tokens.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "cli_run.h"
#include "golden/fixture_util.h"

namespace pd {
namespace {

using test::CliRun;

CliRun run(const std::string& args) {
  return test::run_cli(args, true);
}

std::string join(const std::vector<int32_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}

class GenerateCli : public ::testing::TestWithParam<std::string> {};

TEST_P(GenerateCli, GreedyIdsMatchReference) {
  const std::string dir = golden::fixtures_dir() + "/" + GetParam();
  Expected<TensorStore> ref = TensorStore::open_files({dir + "/reference.safetensors"});
  ASSERT_TRUE(ref.has_value()) << ref.status().to_string();
  auto ints = [&](const std::string& key) {
    const TensorInfo* t = ref->find(key);
    PD_ASSERT(t != nullptr && t->dtype == DType::kI32, "{}", key);
    const auto* p = reinterpret_cast<const int32_t*>(t->data);
    return std::vector<int32_t>(p, p + t->numel());
  };
  const std::vector<int32_t> prompt = ints("p1.input_ids"), greedy = ints("p1.greedy");
  // Prefill chunks of 3 rows exercise multi-row steps; f32 KV as in the reference.
  const CliRun r =
      run(fmt::format("generate --model {} --prompt-ids {} -n {} --kv-dtype f32 --prefill-chunk 3 --threads "
                      "2 --no-mtp --ignore-eos --temp 0 --json",
                      dir, join(prompt), greedy.size()));
  ASSERT_EQ(r.rc, 0) << r.out;
  const size_t brace = r.out.rfind("\n{");
  const nlohmann::json j = nlohmann::json::parse(r.out.substr(brace == std::string::npos ? 0 : brace + 1));
  EXPECT_EQ(j.at("tokens").get<std::vector<int32_t>>(), greedy);
  const double rss = j.at("peak_rss_mib").get<double>();
  EXPECT_GT(rss, 0.0);
  std::printf("%s: puredrive generate peak RSS %.1f MiB, decode %.0f tok/s\n", GetParam().c_str(), rss,
              j.at("decode_tokens_per_second").get<double>());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GenerateCli, ::testing::ValuesIn(golden::fixture_names()),
                         [](const ::testing::TestParamInfo<std::string>& i) {
                           std::string s = i.param;
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

TEST(GenerateCliErrors, PlanLargerThanMemoryIsRefused) {
  // config.json of the real Qwen3.5-35B-A3B without weights: ~66 GiB of bf16 weights, so the default
  // context cannot help; the error comes from config.json before any weight would be mapped.
  const CliRun r = run(fmt::format("generate --model {}/configs/qwen3.5-35b-a3b --prompt-ids 1,2 -n 4",
                                   golden::fixtures_dir()));
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find("the weights alone need"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("available"), std::string::npos) << r.out;
}

TEST(GenerateCliErrors, ExplicitContextLargerThanMemoryIsRefused) {
  const CliRun r =
      run(fmt::format("generate --model {}/configs/qwen3.5-35b-a3b --prompt-ids 1,2 -n 4 --ctx-size 262144",
                      golden::fixtures_dir()));
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find("the plan needs"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--ctx-size 262144"), std::string::npos) << r.out;
}

TEST(GenerateCliDefaults, AutoBackendAndContextFromTheModel) {
  const std::string dir = golden::fixtures_dir() + "/tiny-coder";
  auto config = load_model_config(dir);
  ASSERT_TRUE(config.has_value()) << config.status().message();
  ASSERT_EQ(config->max_position_embeddings, 32768);
  // No --backend, no --ctx-size: auto picks the CPU in a build without CUDA, and the tiny model's full
  // context fits in any machine that runs the tests.
  const CliRun r = run(fmt::format("generate --model {} --prompt-ids 1,2 -n 2 --temp 0 --json", dir));
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("memory plan: weights "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("(32768 tokens)"), std::string::npos) << r.out;
  const size_t brace = r.out.rfind("\n{");
  const nlohmann::json j = nlohmann::json::parse(r.out.substr(brace == std::string::npos ? 0 : brace + 1));
  // The backend's name carries its details, "cpu (2 threads, avx2+fma)".
  const std::string backend = j.at("backend").get<std::string>();
  EXPECT_NE(r.out.find("backend: " + backend + " (--backend auto)"), std::string::npos) << r.out;
#ifndef PD_HAVE_CUDA
  EXPECT_EQ(backend.substr(0, 4), "cpu ");  // a build without CUDA has nothing else to pick
#endif
}

// --mtp-adaptive: on by default, off keeps every step at --mtp-draft; the tokens are the same. A value
// other than on/off (or true/false) is refused.
TEST(GenerateCliDefaults, MtpAdaptiveSwitch) {
  const std::string dir = golden::fixtures_dir() + "/tiny-coder";
  std::vector<int32_t> tokens[2];
  for (const int i : {0, 1}) {
    const CliRun r =
        run(fmt::format("generate --model {} --backend cpu --prompt-ids 1,2,3,4 -n 24 --temp 0 "
                        "--ignore-eos --mtp-draft 2 {} --json",
                        dir, i == 0 ? "" : "--mtp-adaptive off"));
    ASSERT_EQ(r.rc, 0) << r.out;
    const size_t brace = r.out.rfind("\n{");
    const nlohmann::json j = nlohmann::json::parse(r.out.substr(brace == std::string::npos ? 0 : brace + 1));
    EXPECT_EQ(j.at("mtp_adaptive").get<bool>(), i == 0);
    tokens[i] = j.at("tokens").get<std::vector<int32_t>>();
    if (i == 1) {  // only the last step may be plain, when one token is left to emit
      EXPECT_LE(j.at("stats").at("plain_steps").get<int>(), 1) << r.out;
    }
  }
  EXPECT_EQ(tokens[0], tokens[1]);
  const CliRun bad = run(fmt::format("generate --model {} --prompt-ids 1,2 -n 2 --mtp-adaptive maybe", dir));
  EXPECT_NE(bad.rc, 0) << bad.out;
  EXPECT_NE(bad.out.find("--mtp-adaptive"), std::string::npos) << bad.out;
}

}  // namespace
}  // namespace pd
