// `serval chat-template`: renders a chat template for a conversation exactly
// as the server will (and as transformers' apply_chat_template(tokenize=False)
// does), printing the text with nothing added.
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace serval::cli {

namespace {

using ojson = nlohmann::ordered_json;

struct ChatTemplateOptions {
  std::string model;
  std::string template_file;
  std::string messages_file;
  std::string tools_file;
  std::string input;
  bool add_generation_prompt = false;
  std::vector<std::string> vars;
};

std::string read_all(std::istream& in) { return std::string(std::istreambuf_iterator<char>(in), {}); }

std::string read_file(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  SERVAL_CHECK(in, "cannot open ", what, " file \"", path, "\"");
  return read_all(in);
}

ojson parse_json(const std::string& text, const std::string& what) {
  try {
    return ojson::parse(text);
  } catch (const ojson::exception& e) {
    fail(what, " is not valid JSON: ", e.what());
  }
}

// --input FILE.jsonl: one {"messages", "tools", "add_generation_prompt",
// "vars"} object per line; prints one JSON object per line: {"text": ...}, or
// {"error": message, "raised": true when the template called raise_exception}.
int run_batch(const ChatTemplate& tmpl, const Tokenizer* tok, const std::string& path) {
  std::ifstream in(path);
  SERVAL_CHECK(in, "cannot open --input file \"", path, "\"");
  std::string line;
  size_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.empty()) continue;
    ojson req = parse_json(line, str_cat(path, ":", line_no));
    SERVAL_CHECK(req.is_object() && req.contains("messages"), path, ":", line_no,
                 ": expected an object with \"messages\"");
    ojson result = ojson::object();
    try {
      ojson vars = chat_template_variables(req["messages"], req.value("tools", ojson()),
                                           req.value("add_generation_prompt", false), tok,
                                           req.value("vars", ojson::object()));
      result["text"] = tmpl.render(vars);
    } catch (const ChatTemplateRaisedError& e) {
      result["error"] = e.what();
      result["raised"] = true;
    } catch (const Error& e) {
      result["error"] = e.what();
      result["raised"] = false;
    }
    std::cout << result.dump(-1, ' ', false, ojson::error_handler_t::replace) << "\n";
  }
  return 0;
}

int run_chat_template(const ChatTemplateOptions& o) {
  SERVAL_CHECK(!o.model.empty() || !o.template_file.empty(), "give --model or --template");
  std::unique_ptr<Tokenizer> tok;
  if (!o.model.empty()) tok = load_tokenizer(o.model);
  std::string source;
  if (!o.template_file.empty()) {
    source = read_file(o.template_file, "--template");
  } else {
    source = load_chat_template(o.model, !o.tools_file.empty());
    SERVAL_CHECK(!source.empty(), "model \"", o.model, "\" has no chat template; pass one with --template FILE");
  }
  ChatTemplate tmpl(source);
  if (!o.input.empty()) return run_batch(tmpl, tok.get(), o.input);

  bool from_stdin = o.messages_file.empty() || o.messages_file == "-";
  std::string text = from_stdin ? read_all(std::cin) : read_file(o.messages_file, "--messages");
  ojson messages = parse_json(text, from_stdin ? std::string("stdin") : "--messages file \"" + o.messages_file + "\"");
  ojson tools = nullptr;
  if (messages.is_object()) {  // {"messages": [...], "tools": [...]} is accepted too
    if (messages.contains("tools")) tools = messages["tools"];
    SERVAL_CHECK(messages.contains("messages"), "the messages JSON object has no \"messages\" key");
    ojson inner = messages["messages"];
    messages = std::move(inner);
  }
  SERVAL_CHECK(messages.is_array(), "messages must be a JSON array of {role, content} objects");
  if (!o.tools_file.empty())
    tools = parse_json(read_file(o.tools_file, "--tools"), "--tools file \"" + o.tools_file + "\"");

  ojson extra = ojson::object();
  for (const std::string& kv : o.vars) {
    size_t eq = kv.find('=');
    SERVAL_CHECK(eq != std::string::npos && eq > 0, "--var expects key=json, got \"", kv, "\"");
    extra[kv.substr(0, eq)] = parse_json(kv.substr(eq + 1), "--var " + kv.substr(0, eq));
  }
  ojson vars = chat_template_variables(messages, tools, o.add_generation_prompt, tok.get(), extra);
  std::cout << tmpl.render(vars) << std::flush;
  return 0;
}

}  // namespace

void register_chat_template(CLI::App& app, Action& action) {
  auto opts = std::make_shared<ChatTemplateOptions>();
  auto* sub = app.add_subcommand("chat-template", "Render a model's chat template for a conversation (as transformers' "
                                                  "apply_chat_template(tokenize=False) does)");
  sub->add_option("--model,-m", opts->model,
                  "a .gguf file, a folder with tokenizer.json (+ tokenizer_config.json), or a tokenizer.json: "
                  "gives the template and bos_token/eos_token");
  sub->add_option("--template", opts->template_file, "a Jinja template file (overrides the model's)");
  sub->add_option("--messages", opts->messages_file,
                  "JSON file: an array of messages, or {\"messages\": [...], \"tools\": [...]} (default: stdin)");
  sub->add_option("--tools", opts->tools_file, "JSON file: an array of tool schemas");
  sub->add_option("--input", opts->input,
                  "a JSONL file of {messages, tools, add_generation_prompt, vars} objects: prints one JSON result "
                  "per line ({\"text\"} or {\"error\", \"raised\"})");
  sub->add_flag("--add-generation-prompt", opts->add_generation_prompt, "end with the assistant turn's header");
  sub->add_option("--var", opts->vars, "an extra template variable as key=JSON (e.g. enable_thinking=false)");
  sub->callback([opts, &action] { action = [opts] { return run_chat_template(*opts); }; });
}

}  // namespace serval::cli
