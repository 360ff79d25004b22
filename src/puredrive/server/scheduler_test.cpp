// The engine queue: FIFO order, bounded queue, cancellation of queued and running requests, stop strings.
#include <gtest/gtest.h>

#include "puredrive/server/scheduler.h"
#include "puredrive/server/stop_matcher.h"
#include "puredrive/server/testing/test_engines.h"
#include "puredrive/server/testing/test_server.h"

namespace pd::server {
namespace {

using testing::GatedEngine;
using testing::wait_until;
using namespace std::chrono_literals;

GenerationRequest request(std::string id, int32_t max_tokens = 100) {
  GenerationRequest r;
  r.id = std::move(id);
  r.prompt_ids = {1, 2, 3};
  r.max_tokens = max_tokens;
  return r;
}

struct Drained {
  std::string text;
  GenerationResult result;
  bool finished = false;
};

Drained drain(RequestHandle& h, std::chrono::milliseconds timeout = 5s) {
  Drained d;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    auto ev = h.next(20ms);
    if (!ev) continue;
    if (ev->kind == StreamEvent::Kind::kFinished) {
      d.result = ev->result;
      d.finished = true;
      return d;
    }
    d.text += ev->output.text;
  }
  return d;
}

TEST(Scheduler, RunsRequestsInArrivalOrder) {
  GatedEngine engine({"a", "b", "c"});
  engine.close_gate();
  Metrics metrics;
  Scheduler s(engine, 8, &metrics);
  auto h1 = s.submit(request("1"), {});
  auto h2 = s.submit(request("2"), {});
  auto h3 = s.submit(request("3"), {});
  ASSERT_TRUE(h1 && h2 && h3);
  ASSERT_TRUE(wait_until([&] { return h1->started(); }));
  EXPECT_FALSE(h2->started());
  EXPECT_EQ(s.gauges().waiting, 2u);
  EXPECT_EQ(s.gauges().running, 1u);
  engine.open_gate();
  const Drained d1 = drain(*h1), d2 = drain(*h2), d3 = drain(*h3);
  EXPECT_EQ(d1.text, "abc");
  EXPECT_EQ(d2.text, "abc");
  EXPECT_EQ(d3.result.reason, FinishReason::kStop);
  EXPECT_EQ(engine.started(), 3);
  EXPECT_EQ(s.gauges().waiting, 0u);
  EXPECT_EQ(s.gauges().running, 0u);
  EXPECT_NE(metrics.render(s.gauges()).find("puredrive_generations_total{reason=\"stop\"} 3"),
            std::string::npos);
}

TEST(Scheduler, BoundedQueueRefusesWhenFull) {
  GatedEngine engine({"x"});
  engine.close_gate();
  Scheduler s(engine, 2, nullptr);
  auto running = s.submit(request("run"), {});
  ASSERT_TRUE(wait_until([&] { return running->started(); }));
  auto q1 = s.submit(request("q1"), {});
  auto q2 = s.submit(request("q2"), {});
  ASSERT_TRUE(q1 && q2);
  EXPECT_EQ(s.submit(request("q3"), {}), nullptr);  // two waiting: full
  engine.open_gate();
  EXPECT_TRUE(drain(*q2).finished);
  EXPECT_NE(s.submit(request("q4"), {}), nullptr);
}

TEST(Scheduler, CancellingAQueuedRequestRemovesItAtOnce) {
  GatedEngine engine({"x"});
  engine.close_gate();
  Metrics metrics;
  Scheduler s(engine, 4, &metrics);
  auto running = s.submit(request("run"), {});
  ASSERT_TRUE(wait_until([&] { return running->started(); }));
  auto queued = s.submit(request("queued"), {});
  EXPECT_EQ(s.gauges().waiting, 1u);
  queued->cancel();
  EXPECT_EQ(s.gauges().waiting, 0u);
  const Drained d = drain(*queued, 1s);  // finishes while the engine is still busy with the other request
  ASSERT_TRUE(d.finished);
  EXPECT_EQ(d.result.reason, FinishReason::kCancelled);
  engine.open_gate();
  EXPECT_TRUE(drain(*running).finished);
  EXPECT_EQ(engine.started(), 1);  // the cancelled request never reached the engine
}

TEST(Scheduler, CancellingARunningRequestFreesTheEngine) {
  GatedEngine engine(std::vector<std::string>(1000, "t"));
  engine.close_gate(1);  // the engine stays after its first token until cancelled
  Scheduler s(engine, 4, nullptr);
  auto slow = s.submit(request("slow", 1000), {});
  auto next = s.submit(request("next", 3), {});
  ASSERT_TRUE(wait_until([&] { return slow->started(); }));
  auto first = slow->next(2s);
  ASSERT_TRUE(first.has_value());
  slow->cancel();
  const Drained d = drain(*slow);
  ASSERT_TRUE(d.finished);
  EXPECT_EQ(d.result.reason, FinishReason::kCancelled);
  EXPECT_EQ(d.result.stats.completion_tokens, 1);  // the token before the gate
  engine.open_gate();
  const Drained n = drain(*next);
  EXPECT_EQ(n.text, "ttt");
  EXPECT_EQ(n.result.reason, FinishReason::kLength);
  EXPECT_EQ(engine.cancelled(), 1);
}

TEST(Scheduler, StopStringEndsGenerationAndIsNotEmitted) {
  GatedEngine engine({"Hello", " wor", "ld", "END", "more", " text"});
  Scheduler s(engine, 4, nullptr);
  auto h = s.submit(request("stop"), {"ldEN", "zzz"});
  const Drained d = drain(*h);
  EXPECT_EQ(d.text, "Hello wor");
  EXPECT_EQ(d.result.reason, FinishReason::kStop);
  EXPECT_EQ(d.result.stop_string, "ldEN");
  EXPECT_EQ(engine.cancelled(), 1);  // the engine was told to stop at once
  EXPECT_EQ(d.result.stats.completion_tokens, 4);
  // A generation that ends by itself names no stop string.
  auto plain = s.submit(request("plain"), {"zzz"});
  EXPECT_FALSE(drain(*plain).result.stop_string.has_value());
}

// An engine that reports its final end-of-turn token (with a logprob) the way decode/'s generator does.
class EosReportingEngine final : public Engine {
 public:
  EngineInfo info() const override {
    return EngineInfo{
        .model_id = "m", .context_size = 64, .vocab_size = 100, .mtp_draft = 0, .backend = "test"};
  }
  GenerationResult generate(const GenerationRequest&, GenerationSink& sink) override {
    GenerationOutput out;
    out.token_ids = {5, 99};
    out.text = "hi";
    out.logprobs = {TokenLogprob{.token_id = 5, .token = "hi", .logprob = -0.5f, .top = {}},
                    TokenLogprob{.token_id = 99, .token = "<eos>", .logprob = -0.1f, .top = {}}};
    sink.on_output(std::move(out));
    GenerationResult r;
    r.stats.completion_tokens = 2;
    return r;
  }
};

TEST(Scheduler, StopTokenIdsAndLogprobsAreNotDelivered) {
  EosReportingEngine engine;
  Scheduler s(engine, 4, nullptr);
  GenerationRequest r = request("eos");
  r.stop_token_ids = {99};
  auto h = s.submit(std::move(r), {});
  auto ev = h->next(5s);
  ASSERT_TRUE(ev.has_value());
  ASSERT_EQ(ev->kind, StreamEvent::Kind::kOutput);
  EXPECT_EQ(ev->output.token_ids, std::vector<int32_t>{5});
  ASSERT_EQ(ev->output.logprobs.size(), 1u);
  EXPECT_EQ(ev->output.logprobs[0].token_id, 5);
  EXPECT_EQ(ev->output.logprobs[0].token, "hi");
  EXPECT_FLOAT_EQ(ev->output.logprobs[0].logprob, -0.5f);
  EXPECT_EQ(drain(*h).result.stats.completion_tokens, 2);  // still counted
}

TEST(Scheduler, HeldBackTextIsReleasedWhenNoStopMatches) {
  GatedEngine engine({"ab", "c"});
  Scheduler s(engine, 4, nullptr);
  auto h = s.submit(request("nostop"), {"cd"});
  const Drained d = drain(*h);
  EXPECT_EQ(d.text, "abc");
  EXPECT_EQ(d.result.reason, FinishReason::kStop);
}

TEST(Scheduler, ShutdownCancelsQueuedAndRunning) {
  GatedEngine engine({"x"});
  engine.close_gate();
  auto s = std::make_unique<Scheduler>(engine, 4, nullptr);
  auto running = s->submit(request("run"), {});
  auto queued = s->submit(request("queued"), {});
  ASSERT_TRUE(wait_until([&] { return running->started(); }));
  s->shutdown();
  EXPECT_EQ(drain(*queued, 1s).result.reason, FinishReason::kCancelled);
  EXPECT_EQ(drain(*running, 1s).result.reason, FinishReason::kCancelled);
  EXPECT_EQ(s->submit(request("late"), {}), nullptr);
}

// StopMatcher on its own: outputs keep their tokens; text is held only while it may start a stop string.
std::vector<GenerationOutput> feed(StopMatcher& m, const std::vector<std::string>& pieces) {
  std::vector<GenerationOutput> out;
  int32_t id = 0;
  for (const auto& p : pieces) {
    GenerationOutput o;
    o.text = p;
    o.token_ids = {id++};
    for (auto& r : m.push(std::move(o))) out.push_back(std::move(r));
  }
  return out;
}

std::string joined(const std::vector<GenerationOutput>& v) {
  std::string s;
  for (const auto& o : v) s += o.text;
  return s;
}

TEST(StopMatcher, HoldsOnlyPossibleStopPrefixes) {
  StopMatcher m({"</end>"});
  auto out = feed(m, {"abc<", "/e"});
  EXPECT_EQ(joined(out), "abc");  // "</e" may still become "</end>"
  out = feed(m, {"x"});
  EXPECT_EQ(joined(out), "</ex");
  EXPECT_FALSE(m.matched());
}

TEST(StopMatcher, MatchAcrossOutputsCutsTextKeepsTokens) {
  StopMatcher m({"STOP"});
  auto out = feed(m, {"one S", "TO", "P two"});
  EXPECT_TRUE(m.matched());
  EXPECT_EQ(joined(out), "one ");
  size_t tokens = 0;
  for (const auto& o : out) tokens += o.token_ids.size();
  EXPECT_EQ(tokens, 1u);  // only the output whose text survives
  EXPECT_TRUE(feed(m, {"later"}).empty());
}

TEST(StopMatcher, EarliestOfSeveralStopsWins) {
  StopMatcher m({"bb", "a"});
  EXPECT_EQ(m.matched_string(), "");
  auto out = feed(m, {"xxbbya"});
  EXPECT_EQ(joined(out), "xx");
  EXPECT_EQ(m.matched_string(), "bb");
}

// Where two stop strings overlap, the one that completes first wins, however the text was split.
TEST(StopMatcher, OutcomeDoesNotDependOnHowTheTextWasSplit) {
  const std::vector<std::vector<std::string>> splits = {
      {"abcd"}, {"ab", "cd"}, {"abc", "d"}, {"a", "b", "c", "d"}};
  for (const auto& pieces : splits) {
    StopMatcher m({"", "abcd", "bc"});  // an empty stop string is ignored and does not shift the others
    EXPECT_EQ(joined(feed(m, pieces)), "a") << pieces.size() << " pieces";
    EXPECT_TRUE(m.matched());
    EXPECT_EQ(m.matched_string(), "bc");
  }
}

TEST(StopMatcher, FlushReleasesHeldText) {
  StopMatcher m({"abc"});
  auto out = feed(m, {"xab"});
  EXPECT_EQ(joined(out), "x");
  EXPECT_EQ(joined(m.flush()), "ab");
}

TEST(StopMatcher, NoStopsPassesThrough) {
  StopMatcher m({});
  EXPECT_EQ(joined(feed(m, {"a", "", "b"})), "ab");
}

}  // namespace
}  // namespace pd::server
