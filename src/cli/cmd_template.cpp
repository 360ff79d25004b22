// puredrive template: render a chat prompt exactly as transformers' apply_chat_template(tokenize=False).
#include <cstdio>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "puredrive/chat/chat_template.h"
#include "puredrive/util/mapped_file.h"

namespace pd::cli {
namespace {

using ojson = nlohmann::ordered_json;

struct TemplateArgs {
  std::string model_dir;
  std::string messages_file;
  std::string tools_file;
  std::string template_file;
  std::string kwargs = "{}";
  bool add_generation_prompt = false;
};

[[noreturn]] void fail_with(const std::string& message) {
  fmt::print(stderr, "puredrive template: {}\n", message);
  throw CLI::RuntimeError(1);
}

ojson read_json_file(const std::string& path, const char* what) {
  auto text = read_text_file(path);
  if (!text.has_value()) fail_with(text.status().message());
  ojson j = ojson::parse(*text, nullptr, false);
  if (j.is_discarded()) fail_with(fmt::format("{} file {}: not valid JSON", what, path));
  return j;
}

void run(const TemplateArgs& args) {
  if (args.model_dir.empty() && args.template_file.empty()) fail_with("give --model DIR or --template FILE");
  chat::ChatInputs inputs;
  ojson messages = read_json_file(args.messages_file, "messages");
  // Either a bare message list or a request-like object {"messages": [...], "tools": [...]}.
  if (messages.is_object()) {
    if (messages.contains("tools")) inputs.tools = messages["tools"];
    if (!messages.contains("messages"))
      fail_with(fmt::format("{}: object without a \"messages\" list", args.messages_file));
    messages = messages["messages"];
  }
  inputs.messages = std::move(messages);
  if (!args.tools_file.empty()) inputs.tools = read_json_file(args.tools_file, "tools");
  inputs.add_generation_prompt = args.add_generation_prompt;
  inputs.extra = ojson::parse(args.kwargs, nullptr, false);
  if (inputs.extra.is_discarded() || !inputs.extra.is_object()) fail_with("--kwargs must be a JSON object");

  Expected<chat::ChatTemplate> tmpl = Status(ErrorCode::kInternal, "unset");
  if (!args.template_file.empty()) {
    auto source = read_text_file(args.template_file);
    if (!source.has_value()) fail_with(source.status().message());
    ojson special = ojson::object();
    if (!args.model_dir.empty()) {
      auto config_text = read_text_file(args.model_dir + "/tokenizer_config.json");
      if (config_text.has_value()) {
        special = chat::special_tokens_from_config(ojson::parse(*config_text, nullptr, false));
      }
    }
    tmpl = chat::ChatTemplate::from_source(*source, std::move(special), args.template_file);
  } else {
    tmpl = chat::ChatTemplate::load(args.model_dir);
  }
  if (!tmpl.has_value()) fail_with(tmpl.status().message());
  auto prompt = tmpl->render(inputs);
  if (!prompt.has_value()) fail_with(prompt.status().message());
  std::fwrite(prompt->data(), 1, prompt->size(), stdout);
  std::fflush(stdout);
}

void setup_template(CLI::App& app) {
  auto args = std::make_shared<TemplateArgs>();
  auto* cmd = app.add_subcommand("template", "Render a chat prompt like transformers' apply_chat_template");
  cmd->add_option("--model", args->model_dir,
                  "Model directory (tokenizer_config.json / chat_template.jinja)");
  cmd->add_option("--messages", args->messages_file,
                  "JSON file: a list of messages, or {\"messages\": [...]}")
      ->required();
  cmd->add_option("--tools", args->tools_file, "JSON file: a list of tool schemas");
  cmd->add_flag("--add-generation-prompt", args->add_generation_prompt, "Append the assistant prompt");
  cmd->add_option("--kwargs", args->kwargs,
                  "Extra template variables as a JSON object, e.g. '{\"enable_thinking\": false}'");
  cmd->add_option("--template", args->template_file, "Use this Jinja template instead of the model's");
  cmd->footer("strftime_now() uses the PD_FIXED_DATE environment variable (YYYY-MM-DD[THH:MM:SS]) when set.");
  cmd->callback([args] { run(*args); });
}

const bool registered = register_command(setup_template);

}  // namespace
}  // namespace pd::cli
