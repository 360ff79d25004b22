// What the built-in web page relies on: the pages themselves (served open, self-contained, the benchmark
// records embedded as they are in bench/results), GET /v1/puredrive/info, the "puredrive" request field
// (MTP off for the exactness replay) and the "puredrive" figures of a response. The page in a real browser:
// tests/server/test_web_page.py.
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "puredrive/server/chat_request.h"
#include "puredrive/server/testing/test_server.h"

namespace pd::server {
namespace {

using nlohmann::json;
using testing::expect_openai_error;
using testing::ServerSetup;
using testing::TestServer;

// The JSON of the page's <script id="bench-data" type="application/json">.
json embedded_bench_data(const std::string& html) {
  const std::string open = R"(<script id="bench-data" type="application/json">)";
  const size_t at = html.find(open);
  if (at == std::string::npos) return nullptr;
  const size_t from = at + open.size();
  return json::parse(html.substr(from, html.find("</script>", from) - from), nullptr, false);
}

// The benchmark records in the tree, read here with nlohmann (the page's data comes from a CMake script).
std::map<std::string, json> records_on_disk() {
  namespace fs = std::filesystem;
  const fs::path root = fs::path(PD_SOURCE_DIR) / "bench" / "results";
  std::map<std::string, json> out;
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    if (!e.is_regular_file() || e.path().extension() != ".json") continue;
    const fs::path rel = fs::relative(e.path(), root);
    if (std::distance(rel.begin(), rel.end()) > 2) continue;  // bench/results/*.json and */*.json
    std::ifstream f(e.path());
    std::stringstream text;
    text << f.rdbuf();
    json j = json::parse(text.str(), nullptr, false);
    if (!j.is_object() || !j.contains("schema") || !j["schema"].is_string()) continue;
    if (j["schema"].get<std::string>().rfind("puredrive-bench/", 0) != 0) continue;
    // Decode benchmarks only: cells of one weight format (web_assets.cmake plots nothing else).
    const bool decode = j.contains("cells") && j["cells"].is_array() && j.contains("model") &&
                        j["model"].is_object() && j["model"].contains("quant");
    if (!decode) continue;
    out[rel.string()] = std::move(j);
  }
  return out;
}

TEST(WebPage, PagesAreOpenSelfContainedHtml) {
  ServerSetup setup;
  setup.api_key = "sekrit";
  TestServer s(setup);
  for (const char* path : {"/", "/bench"}) {
    SCOPED_TRACE(path);
    const auto r = s.get(path);  // no key: the pages hold no secret, the API they call asks for it
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.header("Content-Type"), "text/html; charset=utf-8");
    EXPECT_NE(r.header("Content-Security-Policy").find("connect-src 'self'"), std::string::npos);
    EXPECT_NE(r.body.find("<title>PureDrive"), std::string::npos);
    // Nothing from the network: the only absolute URL is the SVG namespace, which names, not loads.
    for (size_t at = r.body.find("http"); at != std::string::npos; at = r.body.find("http", at + 1)) {
      if (r.body.compare(at, 5, "https") == 0 || r.body.compare(at, 5, "http:") == 0) {
        EXPECT_EQ(r.body.compare(at, 26, "http://www.w3.org/2000/svg"), 0) << r.body.substr(at, 60);
      }
    }
  }
  expect_openai_error(s.get("/v1/puredrive/info"), 401, "invalid_api_key");
  // "/" is exact, not a prefix of every path.
  expect_openai_error(s.get("/index.html"), 404, "unknown_url");
  expect_openai_error(s.post("/", "{}"), 405, "method_not_allowed");
}

TEST(WebPage, InfoNamesTheServedModel) {
  TestServer s(ServerSetup{});
  const auto r = s.get("/v1/puredrive/info");
  ASSERT_EQ(r.status, 200) << r.body;
  const json info = json::parse(r.body);
  const EngineInfo engine = s.engine.info();
  EXPECT_EQ(info["model"], "m");
  EXPECT_EQ(info["backend"], engine.backend);
  EXPECT_EQ(info["context_size"], engine.context_size);
  EXPECT_EQ(info["mtp_draft"], engine.mtp_draft);
  EXPECT_EQ(info["context_size"], json::parse(s.get("/v1/models").body)["data"][0]["max_model_len"]);
}

TEST(WebPage, BenchPageEmbedsEveryRecordAsInTheTree) {
  TestServer s(ServerSetup{});
  const json data = embedded_bench_data(s.get("/bench").body);
  ASSERT_TRUE(data.is_object()) << "no parsable bench-data script in /bench";
  const auto disk = records_on_disk();
  ASSERT_FALSE(disk.empty());
  ASSERT_EQ(data["records"].size(), disk.size());
  const json& fields = data["cell_fields"];
  auto index = [&](const char* name) {
    for (size_t i = 0; i < fields.size(); ++i)
      if (fields[i] == name) return i;
    ADD_FAILURE() << "no cell field " << name;
    return size_t{0};
  };
  for (const json& rec : data["records"]) {
    const std::string file = rec["file"];
    SCOPED_TRACE(file);
    ASSERT_TRUE(disk.count(file));
    const json& src = disk.at(file);
    EXPECT_EQ(rec["quant"], src["model"]["quant"]);
    EXPECT_EQ(rec["date"], src["date_utc"]);
    ASSERT_EQ(rec["cells"].size(), src["cells"].size());
    for (size_t i = 0; i < src["cells"].size(); ++i) {
      const json& cell = rec["cells"][i];
      const json& want = src["cells"][i];
      EXPECT_EQ(cell[index("context")], want["context"]);
      EXPECT_DOUBLE_EQ(cell[index("decode_tokens_per_second")].get<double>(),
                       want["decode_tokens_per_second"].get<double>());
      EXPECT_DOUBLE_EQ(cell[index("floor_tokens_per_second")].get<double>(),
                       want["floor_tokens_per_second"].get<double>());
      const json& prefill = want["prefill_tokens_per_second"];
      if (prefill.is_null()) {
        EXPECT_TRUE(cell[index("prefill_tokens_per_second")].is_null());
      } else {
        EXPECT_DOUBLE_EQ(cell[index("prefill_tokens_per_second")].get<double>(), prefill.get<double>());
      }
    }
  }
}

TEST(WebPage, PuredriveRequestFieldTurnsMtpOff) {
  const RequestLimits limits{.model_names = {"m"}, .vocab_size = 100};
  const json base = {{"model", "m"}, {"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}};
  ChatRequest plain;
  ASSERT_FALSE(parse_chat_request(base.dump(), limits, &plain));
  EXPECT_TRUE(plain.common.mtp);
  json off = base;
  off["puredrive"] = {{"mtp", false}};
  ChatRequest req;
  ASSERT_FALSE(parse_chat_request(off.dump(), limits, &req));
  EXPECT_FALSE(req.common.mtp);

  const std::vector<std::tuple<json, std::string, std::string>> bad = {
      {json(3), "puredrive", "invalid_type"},
      {json{{"mtp", "no"}}, "puredrive.mtp", "invalid_type"},
      {json{{"mpt", false}}, "puredrive.mpt", "unknown_parameter"},
  };
  for (const auto& [value, param, code] : bad) {
    SCOPED_TRACE(value.dump());
    json body = base;
    body["puredrive"] = value;
    ChatRequest r;
    const auto err = parse_chat_request(body.dump(), limits, &r);
    ASSERT_TRUE(err);
    EXPECT_EQ(err->status, 400);
    EXPECT_EQ(err->param, param);
    EXPECT_EQ(err->code, code);
  }
}

TEST(WebPage, ResponseFiguresFollowFromTheStats) {
  GenerationStats st;
  st.prompt_tokens = 100;
  st.cached_prompt_tokens = 20;
  st.prefill_seconds = 0.5;
  st.completion_tokens = 24;  // the first from the prefill, 23 in 1 s of decoding
  st.decode_seconds = 1.0;
  st.decode_steps = 10;
  st.draft_tokens = 20;
  st.accepted_draft_tokens = 13;
  st.proposed_at = {10, 10};
  st.accepted_at = {8, 5};
  const json j = puredrive_stats_json(st);
  EXPECT_DOUBLE_EQ(j["prefill_tokens_per_second"].get<double>(), 160.0);  // 80 computed tokens in 0.5 s
  EXPECT_DOUBLE_EQ(j["decode_tokens_per_second"].get<double>(), 23.0);
  EXPECT_DOUBLE_EQ(j["tokens_per_step"].get<double>(), 2.3);
  ASSERT_EQ(j["acceptance_per_position"].size(), 2u);
  EXPECT_DOUBLE_EQ(j["acceptance_per_position"][0].get<double>(), 0.8);
  EXPECT_DOUBLE_EQ(j["acceptance_per_position"][1].get<double>(), 0.5);
  EXPECT_EQ(j["draft_tokens"], 20);

  TestServer s(ServerSetup{});
  const json reply = json::parse(s.post("/v1/chat/completions", testing::chat_body(false)).body);
  EXPECT_TRUE(reply.contains("puredrive")) << reply.dump();
  EXPECT_TRUE(reply["puredrive"].contains("decode_tokens_per_second"));
}

}  // namespace
}  // namespace pd::server
