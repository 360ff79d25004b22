// Public API of the Jinja2 interpreter: parse a template once, render it many times.
//
// Semantics follow the environment transformers builds for chat templates (transformers 5.x,
// utils/chat_template_utils.py): jinja2 ImmutableSandboxedEnvironment with trim_blocks=True,
// lstrip_blocks=True, the loopcontrols extension and {% generation %}, a `tojson` filter that is
// json.dumps(x, ensure_ascii=False, ...), and the globals raise_exception and strftime_now. Output is
// byte-identical to jinja2's for the templates checked in tests/templates/.
//
// Errors (syntax errors, undefined values used in a way that needs a value, raise_exception, limits on
// hostile templates) come back as Status values naming the template, line and column.
#pragma once

#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "puredrive/chat/jinja/interpreter.h"
#include "puredrive/chat/jinja/value.h"
#include "puredrive/util/status.h"

namespace pd::jinja {

namespace ast {
struct Program;
}

struct RenderOptions {
  RenderLimits limits;
  // What strftime_now() sees; unset: the PD_FIXED_DATE environment variable if set, else the clock.
  std::optional<std::tm> fixed_now;
};

class Template {
 public:
  static Expected<Template> parse(std::string_view source, std::string name = "template");

  // `context` holds the template's global variables (messages, tools, add_generation_prompt, ...).
  Expected<std::string> render(const Dict& context, const RenderOptions& options = {}) const;
  Expected<std::string> render(const nlohmann::ordered_json& context,
                               const RenderOptions& options = {}) const;

  const std::string& name() const { return name_; }

 private:
  Template(std::string name, std::shared_ptr<const ast::Program> program)
      : name_(std::move(name)), program_(std::move(program)) {}
  std::string name_;
  std::shared_ptr<const ast::Program> program_;
};

// JSON -> template value, keeping object key order (templates iterate dicts in insertion order). Fails on
// input nested deeper than Value::kMaxDepth.
Expected<Value> value_from_json(const nlohmann::ordered_json& j);

// "YYYY-MM-DD" or "YYYY-MM-DDTHH:MM[:SS]" as a local broken-down time, weekday/yearday filled in.
Expected<std::tm> parse_fixed_date(std::string_view text);
// PD_FIXED_DATE from the environment, if set and valid.
std::optional<std::tm> fixed_date_from_env();

}  // namespace pd::jinja
