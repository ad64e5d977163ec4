#include "server/tool_calls.h"

#include <random>

#include "core/error.h"
#include "grammar/grammar.h"
#include "grammar/json_schema_grammar.h"
#include "server/api_error.h"
#include "server/json_fields.h"

namespace serval::server {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;
using Mode = ToolChoice::Mode;

constexpr const char* kHermesOpen = "<tool_call>";
constexpr const char* kHermesClose = "</tool_call>";
constexpr const char* kMistralTag = "[TOOL_CALLS]";
constexpr const char* kPythonTag = "<|python_tag|>";

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

// A model may write numbers no double holds (a 400-digit integer is valid
// JSON and satisfies {"type": "integer"}), which nlohmann refuses. Outside
// strings, such a number is parsed as the string "\u0001<its text>", and
// dump_arguments writes its text back as it was.
constexpr size_t kLongNumber = 17;

// Fed a JSON text a character at a time, says which lie in string literals.
struct JsonStrings {
  bool in_string = false, escaped = false;
  // True for c inside a string literal, its quotes included.
  bool inside(char c) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      return true;
    }
    return in_string = c == '"';
  }
};

json parse_json(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  JsonStrings strings;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (!strings.inside(c) && (c == '-' || (c >= '0' && c <= '9'))) {
      const size_t end = text.find_first_not_of("+-0123456789.eE", i);
      const std::string number = text.substr(i, end == std::string::npos ? std::string::npos : end - i);
      if (number.size() > kLongNumber) {
        out += "\"\\u0001" + number + "\"";
        i += number.size() - 1;
        continue;
      }
    }
    out += c;
  }
  return json::parse(out, nullptr, false);
}

std::string dump_arguments(const json& args) {
  std::string text = args.dump();
  const std::string marker = "\"\\u0001";
  for (size_t at = text.find(marker); at != std::string::npos; at = text.find(marker, at)) {
    const size_t close = text.find('"', at + marker.size());
    text.erase(close, 1);
    text.erase(at, marker.size());
  }
  return text;
}

std::string call_id(ToolFormat f) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  // Mistral's templates check for 9 alphanumeric characters.
  static const char* alnum = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  static const char* hex = "0123456789abcdef";
  std::string id = f == ToolFormat::kMistral ? "" : "call_";
  const int n = f == ToolFormat::kMistral ? 9 : 24;
  for (int i = 0; i < n; ++i) id += f == ToolFormat::kMistral ? alnum[rng() % 62] : hex[rng() & 15];
  return id;
}

// One call object: {"name": string, <args_key>: object or its JSON text}.
std::optional<ToolCall> call_of(const json& obj, ToolFormat f) {
  if (!obj.is_object()) return std::nullopt;
  auto name = obj.find("name");
  if (name == obj.end() || !name->is_string() || name->get<std::string>().empty()) return std::nullopt;
  auto args = obj.find("arguments");
  if (args == obj.end()) args = obj.find("parameters");
  json a = args == obj.end() ? json::object() : *args;
  if (a.is_string()) a = parse_json(a.get<std::string>());
  if (!a.is_object()) return std::nullopt;
  return ToolCall{call_id(f), name->get<std::string>(), dump_arguments(a)};
}

// Top-level JSON values of `s` one after another, separated by whitespace,
// ';' or ','; nullopt when anything else is found or one does not parse.
std::optional<std::vector<json>> json_sequence(const std::string& s) {
  std::vector<json> out;
  size_t i = 0;
  while (i < s.size()) {
    if (std::string(" \t\r\n;,").find(s[i]) != std::string::npos) {
      ++i;
      continue;
    }
    if (s[i] != '{' && s[i] != '[') return std::nullopt;
    // The value's end: balanced brackets outside strings.
    int depth = 0;
    JsonStrings strings;
    size_t j = i;
    for (; j < s.size(); ++j) {
      const char c = s[j];
      if (strings.inside(c)) continue;
      if (c == '{' || c == '[') {
        ++depth;
      } else if ((c == '}' || c == ']') && --depth == 0) {
        break;
      }
    }
    if (j >= s.size()) return std::nullopt;
    json v = parse_json(s.substr(i, j + 1 - i));
    if (v.is_discarded()) return std::nullopt;
    out.push_back(std::move(v));
    i = j + 1;
  }
  return out;
}

ParsedToolOutput parse_hermes(const std::string& text) {
  ParsedToolOutput out;
  std::string content;
  size_t pos = 0;
  for (;;) {
    const size_t open = text.find(kHermesOpen, pos);
    if (open == std::string::npos) {
      content += text.substr(pos);
      break;
    }
    content += text.substr(pos, open - pos);
    const size_t body = open + std::string(kHermesOpen).size();
    size_t close = text.find(kHermesClose, body);
    const bool closed = close != std::string::npos;
    if (!closed) close = text.size();  // the model stopped before closing it
    const json v = parse_json(trim(text.substr(body, close - body)));
    std::optional<ToolCall> call = v.is_discarded() ? std::nullopt : call_of(v, ToolFormat::kHermes);
    if (!call) return {text, {}};  // malformed: everything stays text
    out.calls.push_back(std::move(*call));
    pos = closed ? close + std::string(kHermesClose).size() : text.size();
  }
  out.content = out.calls.empty() ? text : trim(content);
  return out;
}

ParsedToolOutput parse_json_calls(const std::string& text, ToolFormat f) {
  std::string t = trim(text);
  const std::string tag = f == ToolFormat::kMistral ? kMistralTag : kPythonTag;
  if (t.rfind(tag, 0) == 0) t = trim(t.substr(tag.size()));
  const auto values = json_sequence(t);
  if (!values || values->empty()) return {text, {}};
  ParsedToolOutput out;
  for (const json& v : *values) {
    const std::vector<json> objs = v.is_array() ? std::vector<json>(v.begin(), v.end()) : std::vector<json>{v};
    for (const json& o : objs) {
      std::optional<ToolCall> call = call_of(o, f);
      if (!call) return {text, {}};
      out.calls.push_back(std::move(*call));
    }
  }
  return out;
}

// The schema of one call object in `f`'s shape: the name, then the arguments.
ordered_json call_schema(const ordered_json& function, ToolFormat f) {
  ordered_json params = function.contains("parameters") && function["parameters"].is_object()
                            ? function["parameters"]
                            : ordered_json{{"type", "object"}};
  const char* key = f == ToolFormat::kLlama3Json ? "parameters" : "arguments";
  ordered_json props = ordered_json::object();
  props["name"] = {{"const", function["name"]}};
  props[key] = std::move(params);
  return {{"type", "object"}, {"properties", std::move(props)}, {"required", {"name", key}},
          {"additionalProperties", false}};
}

}  // namespace

ToolFormat detect_tool_format(const std::string& src) {
  if (src.find(kHermesOpen) != std::string::npos) return ToolFormat::kHermes;
  if (src.find(kMistralTag) != std::string::npos) return ToolFormat::kMistral;
  if (src.find(kPythonTag) != std::string::npos || src.find("Environment: ipython") != std::string::npos ||
      src.find("\\\"parameters\\\"") != std::string::npos)
    return ToolFormat::kLlama3Json;
  return ToolFormat::kNone;
}

std::optional<ToolFormat> tool_format_named(const std::string& name) {
  if (name == "auto" || name.empty()) return std::nullopt;
  if (name == "hermes") return ToolFormat::kHermes;
  if (name == "llama3_json") return ToolFormat::kLlama3Json;
  if (name == "mistral") return ToolFormat::kMistral;
  fail("--tool-call-parser must be auto, hermes, llama3_json or mistral, got \"", name, "\"");
}

const char* tool_format_name(ToolFormat f) {
  switch (f) {
    case ToolFormat::kHermes: return "hermes";
    case ToolFormat::kLlama3Json: return "llama3_json";
    case ToolFormat::kMistral: return "mistral";
    case ToolFormat::kNone: break;
  }
  return "none";
}

ToolChoice parse_tool_choice(const json& body, const ordered_json& tools) {
  ToolChoice c;
  auto it = body.find("tool_choice");
  if (it == body.end() || it->is_null()) {
    c.mode = tools.is_null() || tools.empty() ? Mode::kNone : Mode::kAuto;
    return c;
  }
  if (it->is_string()) {
    const std::string s = it->get<std::string>();
    if (s == "none") c.mode = Mode::kNone;
    else if (s == "auto") c.mode = Mode::kAuto;
    else if (s == "required") c.mode = Mode::kRequired;
    else throw ApiError(400, str_cat("'tool_choice' must be none, auto, required or a function, got \"", s, "\""),
                        "tool_choice");
  } else if (it->is_object()) {
    const json* fn = get_object(*it, "function");
    auto name = fn ? fn->find("name") : it->end();
    if (!fn || name == fn->end() || !name->is_string())
      throw ApiError(400, "'tool_choice' must name a function: {\"type\": \"function\", \"function\": {\"name\": ...}}",
                     "tool_choice");
    c.mode = Mode::kNamed;
    c.name = name->get<std::string>();
  } else {
    throw ApiError(400, str_cat("'tool_choice' must be a string or an object, got ", json_type_name(*it)), "tool_choice");
  }
  if (c.mode != Mode::kNone && (tools.is_null() || tools.empty()))
    throw ApiError(400, "'tool_choice' needs 'tools'", "tool_choice");
  if (c.mode == Mode::kNamed) {
    bool found = false;
    for (const auto& t : tools)
      found = found || (t.contains("function") && t["function"].value("name", "") == c.name);
    if (!found) throw ApiError(400, str_cat("'tool_choice' names function \"", c.name, "\", which 'tools' lacks"),
                               "tool_choice");
  }
  return c;
}

ConstraintSpec tool_call_constraint(ToolFormat f, const ordered_json& tools, const ToolChoice& choice, bool parallel) {
  if (f == ToolFormat::kNone)
    throw ApiError(400,
                   "'tool_choice' required or a named function needs the model's tool-call format, which its chat "
                   "template does not show: start the server with --tool-call-parser",
                   "tool_choice");
  ordered_json alts = ordered_json::array();
  for (const auto& t : tools) {
    if (!t.contains("function") || !t["function"].is_object() || !t["function"].contains("name"))
      throw ApiError(400, "each of 'tools' must be {\"type\": \"function\", \"function\": {\"name\", ...}}", "tools");
    const ordered_json& fn = t["function"];
    if (choice.mode == Mode::kNamed && fn["name"] != choice.name) continue;
    alts.push_back(call_schema(fn, f));
  }
  const ordered_json schema = alts.size() == 1 ? alts[0] : ordered_json{{"anyOf", alts}};
  grammar::Grammar g;
  try {
    g = grammar::json_schema_to_grammar(schema);
  } catch (const Error& e) {
    throw ApiError(400, str_cat("'tools': a function's parameters cannot constrain the output: ", e.what()), "tools");
  }
  using namespace grammar;
  // The schema's root becomes one call; the new root wraps the calls.
  g.set("call-object", g.find("root") ? std::make_shared<const Expr>(*g.find("root")) : empty());
  ExprPtr call = rule_ref("call-object"), sep;
  switch (f) {
    case ToolFormat::kHermes:
      call = seq({lit(std::string(kHermesOpen) + "\n"), call, lit(std::string("\n") + kHermesClose)});
      sep = lit("\n");
      break;
    case ToolFormat::kLlama3Json: sep = lit("; "); break;
    default: sep = lit(", "); break;
  }
  ExprPtr calls = parallel ? seq({call, star(seq({sep, call}))}) : call;
  if (f == ToolFormat::kMistral) calls = seq({lit("["), calls, lit("]")});
  g.set("root", calls);
  ConstraintSpec spec;
  spec.kind = ConstraintSpec::Kind::kGrammar;
  spec.field = "tool_choice";
  spec.text = to_gbnf(g);
  return spec;
}

ParsedToolOutput parse_tool_calls(ToolFormat f, const std::string& text) {
  switch (f) {
    case ToolFormat::kHermes: return parse_hermes(text);
    case ToolFormat::kLlama3Json:
    case ToolFormat::kMistral: return parse_json_calls(text, f);
    case ToolFormat::kNone: break;
  }
  return {text, {}};
}

std::string ToolCallStream::feed(const std::string& delta) {
  if (holding_) {
    held_ += delta;
    return "";
  }
  held_ += delta;
  if (format_ == ToolFormat::kHermes) {
    const size_t open = held_.find(kHermesOpen);
    if (open != std::string::npos) {
      std::string out = held_.substr(0, open);
      held_ = held_.substr(open);
      holding_ = true;
      return out;
    }
    // Hold back a tail that may be the start of the marker.
    const std::string marker = kHermesOpen;
    size_t keep = 0;
    for (size_t k = std::min(held_.size(), marker.size() - 1); k > 0; --k)
      if (held_.compare(held_.size() - k, k, marker, 0, k) == 0) {
        keep = k;
        break;
      }
    std::string out = held_.substr(0, held_.size() - keep);
    held_ = held_.substr(held_.size() - keep);
    return out;
  }
  if (format_ == ToolFormat::kNone || decided_) {
    std::string out;
    out.swap(held_);
    return out;
  }
  // JSON formats: a call is the whole output, so its first character decides.
  const size_t first = held_.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) return "";
  decided_ = true;
  const char c = held_[first];
  holding_ = c == '{' || c == '[' || c == '<';
  if (holding_) return "";
  std::string out;
  out.swap(held_);
  return out;
}

ParsedToolOutput ToolCallStream::finish() {
  ParsedToolOutput out = parse_tool_calls(format_, held_);
  held_.clear();
  return out;
}

}  // namespace serval::server
