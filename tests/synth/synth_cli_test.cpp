// The user's path on files, through the binary on the CPU: `synth --write` checkpoints in the published
// layouts load and generate what the in-memory synthetic model generates (the same weights, read back through
// the loader); the MLX layout is the one `puredrive quantize` writes; a model that cannot fit is refused
// before any weight is read; `bench --model` runs the docs/DESIGN.md §7 protocol on the
// tiny coder; `bench --synth --mtp-draft` times MTP cycles whose scripted acceptance they must follow.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_run.h"
#include "puredrive/checkpoint/safetensors.h"
#include "puredrive/util/mapped_file.h"

namespace pd {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using test::CliRun;

CliRun run(const std::string& args) {
  return test::run_cli(args, true);
}

// A fresh directory under the temp dir, removed at the end of the test.
class TempDir {
 public:
  explicit TempDir(const std::string& tag)
      : path_(fs::temp_directory_path() /
              fmt::format("pd_synth_cli_{}_{}", tag, static_cast<long>(::getpid()))) {
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }
  std::string str() const { return path_.string(); }

 private:
  fs::path path_;
};

json read_json(const std::string& path) {
  auto text = read_text_file(path);
  EXPECT_TRUE(text.has_value()) << path;
  return text ? json::parse(*text) : json();
}

// The last line of output that parses as a JSON object.
json last_json(const std::string& out) {
  const size_t at = out.rfind("\n{");
  return json::parse(out.substr(at == std::string::npos ? out.find('{') : at + 1));
}

std::vector<int> generate_tokens(const std::string& dir, const std::string& prompt_ids, int n) {
  const CliRun g =
      run(fmt::format("generate --model {} --backend cpu --threads 1 --prompt-ids {} -n {} --no-mtp "
                      "--temp 0 --ignore-eos --json",
                      dir, prompt_ids, n));
  EXPECT_EQ(g.rc, 0) << g.out;
  return g.rc == 0 ? last_json(g.out)["tokens"].get<std::vector<int>>() : std::vector<int>{};
}

TEST(SynthWrite, HfLayoutIsThePublishedOne) {
  TempDir dir("hf");
  const CliRun w =
      run(fmt::format("synth --arch tiny --quant bf16 --write {} --max-shard-mb 0.25", dir.str()));
  ASSERT_EQ(w.rc, 0) << w.out;
  const json c = read_json(dir / "config.json");
  EXPECT_EQ(c["architectures"], json::array({"Qwen3_5MoeForConditionalGeneration"}));
  EXPECT_EQ(c["model_type"], "qwen3_5_moe");
  EXPECT_EQ(c["text_config"]["model_type"], "qwen3_5_moe_text");
  EXPECT_TRUE(c.contains("vision_config"));
  EXPECT_EQ(c["text_config"]["rope_parameters"]["mrope_section"], json::array({3, 3, 2})) << "8 rotary pairs";
  // Shards of at most 256 KiB, named like Qwen's, listed by the index.
  const json index = read_json(dir / "model.safetensors.index.json");
  std::set<std::string> shards;
  for (const auto& [name, file] : index["weight_map"].items()) shards.insert(file.get<std::string>());
  ASSERT_GE(shards.size(), 2u);
  for (const std::string& s : shards) {
    EXPECT_EQ(s.rfind("model.safetensors-000", 0), 0u) << s;
    EXPECT_LE(fs::file_size(dir / s), (256u << 10) + (64u << 10)) << s << ": header aside, at most 256 KiB";
  }
  auto store = TensorStore::open_dir(dir.str());
  ASSERT_TRUE(store.has_value()) << store.status().message();
  struct Want {
    const char* name;
    DType dtype;
    std::vector<int64_t> shape;
  };
  // tiny: H 64, E 8, I 32, C 2*2*16 + 4*16 = 128, Hv 4, dv 16; main experts fused, MTP experts one by one.
  const Want want[] = {
      {"model.language_model.embed_tokens.weight", DType::kBF16, {256, 64}},
      {"model.language_model.layers.0.mlp.experts.gate_up_proj", DType::kBF16, {8, 64, 64}},
      {"model.language_model.layers.0.mlp.experts.down_proj", DType::kBF16, {8, 64, 32}},
      {"model.language_model.layers.0.linear_attn.conv1d.weight", DType::kBF16, {128, 1, 4}},
      {"model.language_model.layers.0.linear_attn.A_log", DType::kF32, {4}},
      {"model.language_model.layers.0.linear_attn.norm.weight", DType::kF32, {16}},
      {"model.language_model.layers.3.self_attn.q_proj.weight", DType::kBF16, {256, 64}},
      {"lm_head.weight", DType::kBF16, {256, 64}},
      {"mtp.fc.weight", DType::kBF16, {64, 128}},
      {"mtp.layers.0.mlp.experts.7.down_proj.weight", DType::kBF16, {64, 32}},
      {"model.visual.patch_embed.proj.weight", DType::kBF16, {32, 3, 2, 4, 4}},
      {"model.visual.merger.linear_fc2.weight", DType::kBF16, {64, 128}},
  };
  for (const Want& x : want) {
    const TensorInfo* t = store->find(x.name);
    ASSERT_NE(t, nullptr) << x.name;
    EXPECT_EQ(t->dtype, x.dtype) << x.name;
    EXPECT_EQ(t->shape, x.shape) << x.name;
  }
  // Zero-centred norms are stored as w = 0 (the loader adds 1), linear_attn.norm as its plain weight 1.
  const TensorInfo* norm = store->find("model.language_model.layers.0.input_layernorm.weight");
  ASSERT_NE(norm, nullptr);
  EXPECT_EQ(bf16_to_f32(reinterpret_cast<const uint16_t*>(norm->data)[5]), 0.0f);
  const TensorInfo* gnorm = store->find("model.language_model.layers.0.linear_attn.norm.weight");
  EXPECT_EQ(reinterpret_cast<const float*>(gnorm->data)[5], 1.0f);
}

// Greedy tokens from the checkpoint on disk equal those of the in-memory model built from the same seed (the
// same weights, read back by the loader with every published layout quirk undone).
TEST(SynthWrite, GeneratesWhatTheInMemoryModelGenerates) {
  for (const char* quant : {"bf16", "q8", "oq6e"}) {
    SCOPED_TRACE(quant);
    TempDir dir(std::string("same_") + quant);
    const CliRun mem = run(
        fmt::format("synth --arch tiny --quant {} --seed 5 --backend cpu --threads 1 -n 24 --json", quant));
    ASSERT_EQ(mem.rc, 0) << mem.out;
    const json m = last_json(mem.out);
    ASSERT_EQ(run(fmt::format("synth --arch tiny --quant {} --seed 5 --write {} -q", quant, dir.str())).rc,
              0);
    std::string ids;
    for (int t : m["prompt"].get<std::vector<int>>()) ids += (ids.empty() ? "" : ",") + std::to_string(t);
    EXPECT_EQ(generate_tokens(dir.str(), ids, 24), m["tokens"].get<std::vector<int>>());
  }
}

// The MLX layout is planned by `puredrive quantize`'s own code: the same tensors (names, dtypes, shapes) and
// the same config.json as quantize writes from the bf16 checkpoint, for the same recipe and group size.
TEST(SynthWrite, MlxLayoutIsWhatQuantizeWrites) {
  TempDir dir("mlx");
  ASSERT_EQ(run(fmt::format("synth --arch tiny --quant bf16 --write {} -q", dir / "bf16")).rc, 0);
  for (const auto& [recipe, group] : {std::pair{"q8", 32}, std::pair{"oq6e", 64}}) {
    SCOPED_TRACE(recipe);
    const std::string synth = dir / (std::string("synth-") + recipe),
                      quant = dir / (std::string("quant-") + recipe);
    ASSERT_EQ(run(fmt::format("synth --arch tiny --quant {} --write {} -q", recipe, synth)).rc, 0);
    const CliRun q = run(fmt::format("quantize --model {} --out {} --recipe {} --group-size {} -q",
                                     dir / "bf16", quant, recipe, group));
    ASSERT_EQ(q.rc, 0) << q.out;
    auto a = TensorStore::open_dir(synth), b = TensorStore::open_dir(quant);
    ASSERT_TRUE(a.has_value() && b.has_value());
    ASSERT_EQ(a->tensors().size(), b->tensors().size());
    for (const TensorInfo& t : b->tensors()) {
      const TensorInfo* s = a->find(t.name);
      ASSERT_NE(s, nullptr) << t.name;
      EXPECT_EQ(s->dtype, t.dtype) << t.name;
      EXPECT_EQ(s->shape, t.shape) << t.name;
    }
    json ca = read_json(synth + "/config.json"), cb = read_json(quant + "/config.json");
    EXPECT_EQ(ca["quantization"], cb["quantization"]);
    EXPECT_EQ(ca["quantization_config"], cb["quantization"]);
    EXPECT_FALSE(ca.contains("vision_config"));
    EXPECT_EQ(ca["text_config"], cb["text_config"]);
  }
}

TEST(SynthWrite, WithTheQwenTokenizerAndTemplate) {
  TempDir dir("tok");
  const std::string tok = std::string(PD_TEST_DATA_DIR) + "/qwen3";
  const std::string tmpl = std::string(PD_SOURCE_DIR) + "/tests/data/templates/Qwen3.5-4B.jinja";
  // tiny's 256-row embedding cannot take Qwen's 151,669 ids.
  const CliRun small = run(fmt::format("synth --arch tiny --write {} --tokenizer {}", dir / "small", tok));
  EXPECT_NE(small.rc, 0);
  EXPECT_NE(small.out.find("tiny-wide-vocab"), std::string::npos) << small.out;
  const std::string d = dir / "wide";
  const CliRun w = run(
      fmt::format("synth --arch tiny-wide-vocab --quant q8 --write {} --tokenizer {} --chat-template {} -q",
                  d, tok, tmpl));
  ASSERT_EQ(w.rc, 0) << w.out;
  for (const char* f :
       {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"}) {
    EXPECT_TRUE(fs::exists(d + "/" + f)) << f;
  }
  // <|im_end|> and <|endoftext|> of the Qwen tokenizer end generation.
  EXPECT_EQ(read_json(d + "/generation_config.json")["eos_token_id"], json::array({151645, 151643}));
  const CliRun g =
      run(fmt::format("generate --model {} --backend cpu --threads 1 --chat \"def add(a, b):\" -n 6 "
                      "--ignore-eos --json",
                      d));
  ASSERT_EQ(g.rc, 0) << g.out;
  EXPECT_EQ(last_json(g.out)["tokens"].size(), 6u);
}

// The memory plan refuses a model that cannot fit before any weight is read: with unreadable weights, the
// error is still the memory plan's.
TEST(Loading, RefusedBeforeReadingWeightsWhenItCannotFit) {
  TempDir dir("nofit");
  // Qwen3.5-35B-A3B's config with a 16M-token context (320 GB of KV cache) fits no machine.
  fs::copy_file(std::string(PD_SOURCE_DIR) + "/tests/fixtures/configs/qwen3.5-35b-a3b/config.json",
                dir / "config.json");
  std::ofstream(dir / "model.safetensors") << "not a safetensors file";
  const CliRun g = run(
      fmt::format("generate --model {} --backend cpu --ctx-size 16777216 --prompt-ids 1,2 -n 1", dir.str()));
  EXPECT_NE(g.rc, 0);
  EXPECT_NE(g.out.find("is available"), std::string::npos) << g.out;
  EXPECT_EQ(g.out.find("safetensors"), std::string::npos) << "the weights were read first: " << g.out;
}

TEST(BenchModel, TinyCoderOnTheCpu) {
  TempDir dir("bench");
  const std::string out = dir / "bench.json";
  const CliRun b =
      run(fmt::format("bench --model {}/models/tiny-coder --backend cpu --threads 1 --contexts 64,8k "
                      "--ctx-size 256 -n 8 --runs 2 --prompt-root {} --json {}",
                      PD_SOURCE_DIR, PD_SOURCE_DIR, out));
  ASSERT_EQ(b.rc, 0) << b.out;
  const json j = read_json(out);
  EXPECT_EQ(j["schema"], "puredrive-bench/1");
  EXPECT_TRUE(j["complete"].get<bool>());
  EXPECT_GT(j["copy_bandwidth_bytes_per_second"].get<double>(), 0);
  // 8k does not fit the 256-token session: skipped with a reason, not run.
  ASSERT_EQ(j["skipped_contexts"].size(), 1u);
  EXPECT_EQ(j["skipped_contexts"][0]["context"], 8192);
  // One context, four modes (the tiny coder has an MTP head and samples by default), two runs each.
  ASSERT_EQ(j["cells"].size(), 8u);
  for (const json& c : j["cells"]) {
    EXPECT_EQ(c["context"], 64);
    EXPECT_EQ(c["prefill_tokens"], 64);
    EXPECT_EQ(c["decode_tokens"], 8);
    EXPECT_GT(c["decode_tokens_per_second"].get<double>(), 0);
    EXPECT_GT(c["floor_tokens_per_second"].get<double>(), 0);
    EXPECT_EQ(c["mode"].get<std::string>().find("-mtp") != std::string::npos, c.contains("tokens_per_cycle"));
  }
  EXPECT_NE(j["cells"][0]["prompt"], j["cells"][1]["prompt"]) << "one prompt per run";
  ASSERT_EQ(j["summary"].size(), 4u);
  EXPECT_EQ(j["summary"][0]["runs"], 2);
  EXPECT_EQ(j["greedy_mtp_identical"]["compared"], 2);
  EXPECT_EQ(j["greedy_mtp_identical"]["identical"], 2);
  EXPECT_EQ(j["model"]["load"]["upload_bytes_per_second"], nullptr) << "the CPU uses the weights in place";
}

// bench --synth --mtp-draft: full MTP cycles with a scripted acceptance through the generator's cycle. The
// scripted drafts copy the tokens plain decoding produced from the same state, so the cycles must emit
// exactly those tokens and accept exactly the scripted counts (the row-exact verify step and the rollback,
// end to end).
TEST(BenchSynth, MtpCyclesWithAScriptedAcceptance) {
  TempDir dir("mtp");
  const std::string out = dir / "bench.json", md = dir / "bench.md";
  const CliRun b = run(fmt::format(
      "bench --synth tiny --backend cpu --threads 1 --contexts 64,100 --fill auto --tokens 48 --mtp-draft 3 "
      "--accept-pattern 1,3,0,2 --json {} --markdown {}",
      out, md));
  ASSERT_EQ(b.rc, 0) << b.out;
  const json j = read_json(out);
  EXPECT_EQ(j["schema"], "puredrive-bench/3");
  // The record's row-exactness checks at the model's dimensions (bench_steps.h): a 3-row step bitwise equal
  // to three one-row steps after a real prefill and, --fill auto, after a long synthetic fill.
  for (const char* key : {"row_exact_check", "row_exact_check_long"}) {
    const json& rx = j[key];
    ASSERT_TRUE(rx.is_object()) << key;
    EXPECT_TRUE(rx["pass"].get<bool>()) << rx.dump();
    EXPECT_EQ(rx["rows"], 3) << key;
    EXPECT_GT(rx["kv_layers"].get<int>(), 0) << key;
    EXPECT_GT(rx["gdn_layers"].get<int>(), 0) << key;
  }
  EXPECT_EQ(j["row_exact_check"]["fill"], "real");
  EXPECT_EQ(j["row_exact_check_long"]["fill"], "synthetic");
  ASSERT_EQ(j["cells"].size(), 2u);
  for (const json& c : j["cells"]) {
    const json& m = c["mtp_cycle"];
    ASSERT_TRUE(m.is_object()) << c.dump();
    EXPECT_TRUE(m["output_equals_plain"].get<bool>()) << m.dump();
    EXPECT_TRUE(m["acceptance_as_scripted"].get<bool>()) << m.dump();
    EXPECT_EQ(m["draft_tokens"], 3);
    EXPECT_EQ(m["acceptance"], "scripted");
    // The pattern's counts, each in its slot of the histogram: 0, 1, 2 and 3 accepted drafts all occur.
    int64_t cycles = 0, tokens = 0;
    for (size_t a = 0; a < m["accepted_histogram"].size(); ++a) {
      const auto n = m["accepted_histogram"][a].get<int64_t>();
      EXPECT_GT(n, 0) << "accepted " << a;
      cycles += n;
      tokens += n * static_cast<int64_t>(a + 1);
    }
    EXPECT_EQ(cycles, m["cycles"].get<int64_t>());
    EXPECT_EQ(tokens, m["tokens"].get<int64_t>());
    EXPECT_GT(m["cycle_ms"].get<double>(), 0);
    EXPECT_GT(m["plain_step_ms"].get<double>(), 0);
    EXPECT_GT(m["floor"]["bytes_per_cycle"].get<double>(), 0);
    EXPECT_GT(m["fraction_of_floor"].get<double>(), 0);
    // The verify step timed with one token repeated and with different tokens.
    const json& v = c["verify"];
    EXPECT_GT(v["ratio"].get<double>(), 0) << v.dump();
    EXPECT_GT(v["ratio_distinct"].get<double>(), 0) << v.dump();
    EXPECT_GT(v["rn_distinct_ms"].get<double>(), 0) << v.dump();
  }
  auto text = read_text_file(md);
  ASSERT_TRUE(text.has_value());
  EXPECT_NE(text->find("MTP cycles"), std::string::npos) << *text;

  // From a synthetic fill (the long-context cells' path), with a draft vocabulary and a window.
  const CliRun f = run(fmt::format(
      "bench --synth tiny --backend cpu --threads 1 --contexts 90 --fill synthetic --tokens 40 --mtp-draft 2 "
      "--accept-mean 2.5 --mtp-draft-vocab 100 --mtp-window 16 --json {}",
      out));
  ASSERT_EQ(f.rc, 0) << f.out;
  const json fj = read_json(out);
  ASSERT_EQ(fj["cells"].size(), 1u);
  const json& fm = fj["cells"][0]["mtp_cycle"];
  EXPECT_EQ(fj["cells"][0]["fill"], "synthetic");
  EXPECT_TRUE(fm["output_equals_plain"].get<bool>()) << fm.dump();
  EXPECT_TRUE(fm["acceptance_as_scripted"].get<bool>()) << fm.dump();
  EXPECT_EQ(fm["mtp_draft_vocab"], 100);

  // Seeded sampling: the scripted drafts copy the plain run's draws, which the seeded rule accepts.
  const CliRun sd =
      run(fmt::format("bench --synth tiny --backend cpu --threads 1 --contexts 64 --tokens 40 --mtp-draft 2 "
                      "--mtp-rule seeded "
                      "--accept-pattern 2,0,1 --json {}",
                      out));
  ASSERT_EQ(sd.rc, 0) << sd.out;
  const json sj = read_json(out);
  const json& sm = sj["cells"][0]["mtp_cycle"];
  EXPECT_EQ(sm["rule"], "seeded (temperature 0.8, top-p 0.95)");
  EXPECT_TRUE(sm["output_equals_plain"].get<bool>()) << sm.dump();
  EXPECT_TRUE(sm["acceptance_as_scripted"].get<bool>()) << sm.dump();
  const CliRun rule =
      run("bench --synth tiny --backend cpu --contexts 64 --tokens 48 --mtp-draft 2 --mtp-rule nucleus");
  EXPECT_NE(rule.rc, 0);
  EXPECT_NE(rule.out.find("--mtp-rule: nucleus not in {greedy,seeded}"), std::string::npos) << rule.out;

  const CliRun bad =
      run("bench --synth tiny --backend cpu --contexts 64 --tokens 48 --mtp-draft 2 --accept-pattern 1,3");
  EXPECT_NE(bad.rc, 0);
  EXPECT_NE(bad.out.find("--accept-pattern: '3' is not a number of accepted drafts in 0..2"),
            std::string::npos)
      << bad.out;
  const CliRun mean =
      run("bench --synth tiny --backend cpu --contexts 64 --tokens 48 --mtp-draft 1 --accept-mean 2.5");
  EXPECT_NE(mean.rc, 0);
  EXPECT_NE(mean.out.find("tokens per cycle must be in 1..2"), std::string::npos) << mean.out;
}

// bench --synth --prefill-runs N: N prefills of each cell's prompt, the median reported; the extra ones go
// into scratch states, so the cell decodes what a single prefill gives.
TEST(BenchSynth, PrefillRunsReportTheirMedian) {
  TempDir dir("prefill-runs");
  const std::string one = dir / "one.json", three = dir / "three.json";
  const std::string cmd = "bench --synth tiny --backend cpu --threads 1 --contexts 64 --tokens 6 --json ";
  ASSERT_EQ(run(cmd + one).rc, 0);
  const CliRun b = run(cmd + three + " --prefill-runs 3");
  ASSERT_EQ(b.rc, 0) << b.out;
  const json c1 = read_json(one)["cells"][0], c3 = read_json(three)["cells"][0];
  ASSERT_EQ(c1["prefill_runs_seconds"].size(), 1u);
  ASSERT_EQ(c3["prefill_runs_seconds"].size(), 3u);
  std::vector<double> t;
  for (const json& r : c3["prefill_runs_seconds"]) t.push_back(r.get<double>());
  std::sort(t.begin(), t.end());
  EXPECT_GT(t[0], 0.0);
  EXPECT_EQ(c3["prefill_seconds"].get<double>(), t[1]);
  EXPECT_DOUBLE_EQ(c3["prefill_tokens_per_second"].get<double>(), 64 / t[1]);
  ASSERT_FALSE(c1["first_tokens"].empty());
  EXPECT_EQ(c3["first_tokens"], c1["first_tokens"]);
  EXPECT_NE(run(cmd + three + " --prefill-runs 0").rc, 0);
}

TEST(BenchModel, ReadWeightsThroughTheUploadReader) {
  TempDir dir("read");
  const std::string out = dir / "read.json";
  const CliRun b =
      run(fmt::format("bench --model {}/models/tiny-coder --read-weights --json {}", PD_SOURCE_DIR, out));
  ASSERT_EQ(b.rc, 0) << b.out;
  const json j = read_json(out);
  ASSERT_EQ(j["passes"].size(), 3u);
  EXPECT_EQ(j["passes"][2]["read"], "mmap");
  auto store = TensorStore::open_dir(std::string(PD_SOURCE_DIR) + "/models/tiny-coder");
  ASSERT_TRUE(store.has_value());
  EXPECT_EQ(j["weight_bytes"].get<uint64_t>(), store->total_bytes());
  EXPECT_GT(j["passes"][1]["bytes_per_second"].get<double>(), 0);
}

}  // namespace
}  // namespace pd
