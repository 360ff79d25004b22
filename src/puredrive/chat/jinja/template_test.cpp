// Jinja interpreter vs Python jinja2 (transformers' chat-template environment) on small feature templates.
// Expected outputs and errors: tests/templates/snippets.json, from
// tools/reference/templates/make_reference.py.
#include "puredrive/chat/jinja/template.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

namespace pd::jinja {
namespace {

nlohmann::ordered_json load_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::ordered_json::parse(ss.str());
}

RenderOptions reference_options() {
  RenderOptions o;
  o.fixed_now = *parse_fixed_date("2025-07-26T10:30:05");
  return o;
}

// Python exception types whose message we reproduce exactly.
bool message_must_match(const std::string& type) {
  return type == "TemplateError" || type == "UndefinedError" || type == "SecurityError" ||
         type == "TypeError" || type == "ValueError" || type == "TemplateRuntimeError" ||
         type == "TemplateAssertionError" || type == "OverflowError" || type == "ZeroDivisionError";
}

TEST(JinjaSnippets, MatchPythonJinja2) {
  const auto data = load_json(std::string(PD_SOURCE_DIR) + "/tests/templates/snippets.json");
  const auto& snippets = data.at("snippets");
  ASSERT_GT(snippets.size(), 150u);
  int checked = 0;
  for (const auto& s : snippets) {
    const std::string name = s.at("name").get<std::string>();
    SCOPED_TRACE("snippet " + name + ": " + s.at("template").get<std::string>());
    auto tmpl = Template::parse(s.at("template").get<std::string>(), name);
    if (s.contains("output")) {
      ASSERT_TRUE(tmpl.has_value()) << tmpl.status().message();
      auto out = tmpl->render(s.at("context"), reference_options());
      ASSERT_TRUE(out.has_value()) << out.status().message();
      EXPECT_EQ(*out, s.at("output").get<std::string>());
    } else {
      const auto& err = s.at("error");
      const std::string type = err.at("type").get<std::string>();
      const std::string message = err.at("message").get<std::string>();
      std::string ours;
      if (!tmpl.has_value()) {
        ours = tmpl.status().message();
      } else {
        auto out = tmpl->render(s.at("context"), reference_options());
        ASSERT_FALSE(out.has_value())
            << "jinja2 raised " << type << ": " << message << "\nbut we rendered: " << *out;
        ours = out.status().message();
      }
      if (message_must_match(type)) {
        EXPECT_NE(ours.find(message), std::string::npos)
            << "jinja2: " << type << ": " << message << "\nours: " << ours;
      }
      if (err.contains("line")) {
        const std::string where = fmt::format("{}:{}:", name, err.at("line").get<int>());
        EXPECT_EQ(ours.rfind(where, 0), 0u)
            << "expected the error at line " << err.at("line") << ", got: " << ours;
      }
    }
    ++checked;
  }
  EXPECT_EQ(checked, static_cast<int>(snippets.size()));
}

}  // namespace
}  // namespace pd::jinja
