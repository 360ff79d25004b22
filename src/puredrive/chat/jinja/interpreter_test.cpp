// Interpreter behaviour that jinja2 cannot serve as a reference for: error locations, limits on hostile
// templates, thread safety of a parsed template, the fixed clock, the JSON bridge.
#include <gtest/gtest.h>

#include <cstdlib>
#include <thread>

#include "puredrive/chat/jinja/template.h"

namespace pd::jinja {
namespace {

using ojson = nlohmann::ordered_json;

std::string render_ok(const std::string& source, const ojson& context = ojson::object()) {
  auto t = Template::parse(source, "t");
  EXPECT_TRUE(t.has_value()) << t.status().message();
  if (!t.has_value()) return "";
  auto out = t->render(context);
  EXPECT_TRUE(out.has_value()) << out.status().message();
  return out.has_value() ? *out : "";
}

Status render_error(const std::string& source, const ojson& context = ojson::object(),
                    RenderOptions options = {}) {
  auto t = Template::parse(source, "t");
  if (!t.has_value()) return t.status();
  auto out = t->render(context, options);
  EXPECT_FALSE(out.has_value()) << "rendered: " << (out.has_value() ? *out : "");
  return out.has_value() ? Status::ok() : out.status();
}

TEST(JinjaErrors, SyntaxErrorsCarryLineAndColumn) {
  EXPECT_EQ(render_error("line one\n  {{ 1 + }}").message(),
            "t:2:10: syntax error: unexpected 'end of print statement'");
  EXPECT_EQ(render_error("ab\ncd {% if x %}\n").message().rfind("t:2:", 0), 0u);
  EXPECT_EQ(render_error("{{ 'unterminated }}").message().rfind("t:1:4:", 0), 0u);
  EXPECT_EQ(render_error("x\n\n{% for a in b %}{% endif %}").message(),
            "t:3:20: syntax error: Encountered unknown tag 'endif'. The innermost block that needs to be "
            "closed is 'for'.");
  EXPECT_EQ(render_error("{{ x | nosuchfilter }}").message(),
            "t:1:8: syntax error: No filter named 'nosuchfilter'.");
}

TEST(JinjaErrors, RuntimeErrorsPointAtTheExpression) {
  const Status s = render_error("first\n{% for m in messages %}\n  {{ m.content.upper() }}{% endfor %}",
                                ojson{{"messages", ojson::array({ojson::object()})}});
  EXPECT_EQ(s.message(), "t:3:15: undefined error: 'dict object' has no attribute 'content'");
  const Status raised = render_error("\n\n   {{ raise_exception('bad input: ' ~ 3) }}");
  EXPECT_EQ(raised.message(), "t:3:7: template raised an exception: bad input: 3");
  EXPECT_EQ(raised.code(), ErrorCode::kInvalidArgument);
}

TEST(JinjaErrors, UnsupportedFeaturesAreReportedAsSuch) {
  const Status s = render_error("{% include 'other.jinja' %}");
  EXPECT_EQ(s.code(), ErrorCode::kUnsupported);
  EXPECT_NE(s.message().find("include"), std::string::npos);
  EXPECT_EQ(render_error("{{ [1, 2] | random }}").code(), ErrorCode::kUnsupported);
}

TEST(JinjaLimits, InfiniteMacroRecursionIsAnError) {
  const Status s = render_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  EXPECT_NE(s.message().find("maximum recursion depth exceeded"), std::string::npos) << s.message();
  const Status loop = render_error("{% for x in [1] recursive %}{{ loop([x]) }}{% endfor %}");
  EXPECT_NE(loop.message().find("maximum recursion depth exceeded"), std::string::npos) << loop.message();
}

TEST(JinjaLimits, RunawayLoopsStop) {
  RenderOptions o;
  o.limits.max_loop_iterations = 100000;
  const Status s = render_error(
      "{% for a in range(100000) %}{% for b in range(100000) %}{% for c in range(100000) %}{% endfor %}{% "
      "endfor %}{% endfor %}",
      ojson::object(), o);
  EXPECT_NE(s.message().find("more than 100000 loop iterations"), std::string::npos) << s.message();
}

TEST(JinjaLimits, OutputAndStringSizesAreBounded) {
  RenderOptions o;
  o.limits.max_output_bytes = 1 << 20;
  EXPECT_NE(render_error("{% for i in range(100000) %}{{ 'xxxxxxxxxxxxxxxxxxxxxxx' }}{% endfor %}",
                         ojson::object(), o)
                .message()
                .find("limit"),
            std::string::npos);
  EXPECT_NE(render_error("{{ 'a' * 1000000000000 }}", ojson::object(), o).message().find("limit"),
            std::string::npos);
  EXPECT_NE(render_error("{{ [1] * 1000000000000 }}", ojson::object(), o).message().find("limit"),
            std::string::npos);
  EXPECT_NE(render_error("{{ 'ab' | indent(1000000000000) }}", ojson::object(), o).message().find("limit"),
            std::string::npos);
  EXPECT_NE(render_error("{{ 2 ** 200 }}").message().find("integer overflow"), std::string::npos);
}

// Python would build these fields (or fail on its own overflow); we stop at a million characters, with an
// error, not a signed overflow while reading the digits (found by fuzz_jinja under UBSan).
TEST(JinjaLimits, FormatWidthsAndPrecisionsAreBounded) {
  for (const char* source :
       {"{{ '%1111111111111111111111d' % 1 }}", "{{ '%.99999999999999999999f' % 1.5 }}",
        "{{ '%2000000d' % 1 }}", "{{ '%*d' % (2000000, 1) }}", "{{ '%*d' % (-9223372036854775807, 1) }}",
        "{{ '%.*f' % (9223372036854775807, 1.5) }}", "{{ '{:99999999999999999999}'.format(1) }}",
        "{{ '{:.99999999999}'.format(1.5) }}",
        "{{ '%s' | format('x') }}{{ '%-1111111111111s' | format('x') }}"}) {
    const Status s = render_error(source);
    EXPECT_NE(s.message().find("beyond the limit of 1048576"), std::string::npos)
        << source << ": " << s.message();
  }
  EXPECT_EQ(render_ok("{{ '%1048576d' % 1 }}").size(), 1048576u);
}

TEST(JinjaLimits, DeepNestingIsASyntaxErrorNotACrash) {
  const std::string parens = "{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}";
  EXPECT_NE(render_error(parens).message().find("nesting deeper"), std::string::npos);
  std::string blocks;
  for (int i = 0; i < 2000; ++i) blocks += "{% if true %}";
  EXPECT_NE(render_error(blocks).message().find("nesting deeper"), std::string::npos);
  std::string nots = "{{ ";
  for (int i = 0; i < 5000; ++i) nots += "not ";
  EXPECT_NE(render_error(nots + "x }}").message().find("nesting deeper"), std::string::npos);
  // Moderate nesting is fine.
  EXPECT_EQ(render_ok("{{ " + std::string(20, '(') + "1" + std::string(20, ')') + " }}"), "1");
}

TEST(JinjaLimits, DeeplyNestedValuesAreRefused) {
  // Each iteration wraps the previous list: without a bound, printing or freeing it would recurse 100000
  // deep.
  const Status s = render_error(
      "{% set ns = namespace(x=[]) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x "
      "}}");
  EXPECT_NE(s.message().find("nested deeper than"), std::string::npos) << s.message();
  const Status through_ns = render_error(
      "{% set ns = namespace(x=none) %}{% for i in range(100000) %}{% set ns.x = namespace(y=ns.x) %}{% "
      "endfor %}");
  EXPECT_NE(through_ns.message().find("nested deeper than"), std::string::npos) << through_ns.message();
  ojson deep = 1;
  for (int i = 0; i < 1000; ++i) deep = ojson::array({deep});
  auto t = Template::parse("{{ x }}");
  ASSERT_TRUE(t.has_value());
  auto out = t->render(ojson{{"x", deep}});
  ASSERT_FALSE(out.has_value());
  EXPECT_NE(out.status().message().find("nested deeper than"), std::string::npos) << out.status().message();
}

TEST(JinjaLimits, ReferenceCyclesAreReleased) {
  // Cycles through namespaces, macros and loop state: the sanitizer build's leak checker verifies these.
  EXPECT_EQ(render_ok("{% set ns = namespace() %}{% set ns.me = ns %}{% set ns.d = {'n': ns} %}{{ ns.d.n.me "
                      "is defined }}"),
            "True");
  EXPECT_EQ(render_ok("{% macro m() %}x{% endmacro %}{% set ns = namespace(m=m) %}{{ ns.m() }}"), "x");
  EXPECT_EQ(render_ok("{% set ns = namespace() %}{% for i in [1, 2] %}{% set ns.c = loop.changed %}"
                      "{{ loop.changed(ns) }}{% endfor %}"),
            "TrueFalse");
  const Status after_loop = render_error(
      "{% set ns = namespace() %}{% for i in [1] %}{% set ns.c = loop.changed %}{% endfor %}{{ ns.c(1) }}");
  EXPECT_NE(after_loop.message().find("after its loop ended"), std::string::npos) << after_loop.message();
}

TEST(JinjaTemplate, ParsedTemplateIsReusableAcrossThreads) {
  auto t = Template::parse(
      "{% set ns = namespace(total=0) %}{% for m in messages %}{% set ns.total = ns.total + m.n %}{{ m.name "
      "}},{% endfor %}"
      "{{ ns.total }}",
      "shared");
  ASSERT_TRUE(t.has_value()) << t.status().message();
  std::vector<std::thread> threads;
  std::vector<int> failures(4, 0);
  for (int w = 0; w < 4; ++w) {
    threads.emplace_back([&, w] {
      for (int i = 0; i < 200; ++i) {
        ojson messages = ojson::array();
        std::string expected;
        int total = 0;
        for (int k = 0; k <= (w + i) % 7; ++k) {
          messages.push_back({{"name", "w" + std::to_string(w) + "k" + std::to_string(k)}, {"n", k}});
          expected += "w" + std::to_string(w) + "k" + std::to_string(k) + ",";
          total += k;
        }
        auto out = t->render(ojson{{"messages", messages}});
        if (!out.has_value() || *out != expected + std::to_string(total)) ++failures[w];
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int w = 0; w < 4; ++w) EXPECT_EQ(failures[w], 0) << "thread " << w;
}

TEST(JinjaTemplate, FixedDateFromOptionsAndEnvironment) {
  auto t = Template::parse("{{ strftime_now('%Y-%m-%d %a %H:%M') }}");
  ASSERT_TRUE(t.has_value());
  RenderOptions o;
  o.fixed_now = *parse_fixed_date("2024-02-29T23:59");
  EXPECT_EQ(*t->render(ojson::object(), o), "2024-02-29 Thu 23:59");
  ::setenv("PD_FIXED_DATE", "2025-01-15", 1);
  EXPECT_EQ(*t->render(ojson::object()), "2025-01-15 Wed 00:00");
  ::unsetenv("PD_FIXED_DATE");
  EXPECT_FALSE(parse_fixed_date("2025-13-01").has_value());
  EXPECT_FALSE(parse_fixed_date("yesterday").has_value());
}

TEST(JinjaTemplate, JsonContextKeepsKeyOrderAndTypes) {
  const ojson ctx =
      ojson::parse(R"({"d": {"z": 1, "a": 2.0, "m": [true, null, "s"], "big": 9007199254740993}})");
  EXPECT_EQ(render_ok("{% for k in d %}{{ k }} {% endfor %}|{{ d | tojson }}", ctx),
            R"(z a m big |{"z": 1, "a": 2.0, "m": [true, null, "s"], "big": 9007199254740993})");
  auto t = Template::parse("{{ x }}");
  ASSERT_TRUE(t.has_value());
  EXPECT_FALSE(t->render(ojson::array()).has_value());
}

TEST(JinjaTemplate, LargeDictLookupsUseTheIndex) {
  ojson big = ojson::object();
  for (int i = 0; i < 2000; ++i) big["k" + std::to_string(i)] = i;
  EXPECT_EQ(render_ok("{{ d.k1999 }} {{ d['k17'] }} {{ 'k3' in d }} {{ 'nope' in d }} {{ d | length }}",
                      ojson{{"d", big}}),
            "1999 17 True False 2000");
}

}  // namespace
}  // namespace pd::jinja
