#include "tokenizer/chat_template.h"

#include "tokenizer/jinja/errors.h"
#include "tokenizer/jinja/evaluator.h"
#include "tokenizer/jinja/lexer.h"
#include "tokenizer/jinja/parser.h"
#include "tokenizer/tokenizer.h"

namespace serval {

namespace {

using jinja::Body;
using jinja::Expr;
using jinja::Stmt;

// jinja2 rejects unknown filters and tests when compiling, even in branches
// that never run; so do we.
void check_names(const Expr* e) {
  if (!e) return;
  if (e->kind == Expr::Kind::Filter && !jinja::find_filter(e->name))
    fail("chat template syntax error at ", jinja::where(e->line, e->column), ": no filter named '", e->name, "'");
  if (e->kind == Expr::Kind::Test && !jinja::find_test(e->name))
    fail("chat template syntax error at ", jinja::where(e->line, e->column), ": no test named '", e->name, "'");
  for (const auto& a : e->args) check_names(a.get());
  for (const auto& kw : e->kwargs) check_names(kw.second.get());
}

void check_names(const Body& body) {
  for (const auto& s : body) {
    if (s->kind == Stmt::Kind::Block && !s->text.empty() && !jinja::find_filter(s->text))
      fail("chat template syntax error at ", jinja::where(s->line, s->column), ": no filter named '", s->text, "'");
    check_names(s->expr.get());
    check_names(s->cond.get());
    for (const auto& c : s->conditions) check_names(c.get());
    for (const auto& p : s->params) check_names(p.second.get());
    for (const auto& b : s->bodies) check_names(b);
    check_names(s->else_body);
  }
}

}  // namespace

struct ChatTemplate::Impl {
  Body body;
};

ChatTemplate::ChatTemplate(const std::string& source) : impl_(std::make_unique<Impl>()) {
  impl_->body = jinja::parse_template(source);
  check_names(impl_->body);
}

ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;

std::string ChatTemplate::render(const nlohmann::ordered_json& variables) const {
  SERVAL_CHECK(variables.is_object(), "chat template variables must be a JSON object, got ", variables.type_name());
  try {
    jinja::Evaluator ev(jinja::Value::from_json(variables));
    return ev.render(impl_->body);
  } catch (const jinja::TemplateRaisedError& e) {
    throw ChatTemplateRaisedError(e.what());
  }
}

std::string ChatTemplate::render(const nlohmann::json& variables) const {
  return render(nlohmann::ordered_json::parse(variables.dump()));
}

nlohmann::ordered_json chat_template_special_tokens(const Tokenizer& tok) {
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  if (tok.bos_id >= 0 && tok.bos_id < tok.vocab_size()) out["bos_token"] = tok.token_piece(tok.bos_id);
  if (tok.eos_id >= 0 && tok.eos_id < tok.vocab_size()) out["eos_token"] = tok.token_piece(tok.eos_id);
  return out;
}

namespace {

// transformers' _alias_reasoning_fields: {"thinking": r, **message, "reasoning_content": r}.
nlohmann::ordered_json alias_reasoning(const nlohmann::ordered_json& message) {
  if (!message.is_object()) return message;
  const nlohmann::ordered_json* reasoning = nullptr;
  for (const char* key : {"reasoning_content", "thinking", "reasoning"}) {
    auto it = message.find(key);
    if (it != message.end() && !it->is_null()) {
      reasoning = &*it;
      break;
    }
  }
  if (!reasoning) return message;
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  out["thinking"] = *reasoning;
  for (auto it = message.begin(); it != message.end(); ++it) out[it.key()] = it.value();
  out["reasoning_content"] = *reasoning;
  return out;
}

}  // namespace

nlohmann::ordered_json chat_template_variables(const nlohmann::ordered_json& messages,
                                               const nlohmann::ordered_json& tools, bool add_generation_prompt,
                                               const Tokenizer* tok, const nlohmann::ordered_json& extra) {
  SERVAL_CHECK(messages.is_array(), "chat messages must be a JSON array, got ", messages.type_name());
  // As transformers' apply_chat_template.
  SERVAL_CHECK(!messages.empty(), "Cannot apply chat template to an empty conversation. Provide at least one message.");
  nlohmann::ordered_json prepared = nlohmann::ordered_json::array();
  for (const auto& m : messages) {
    SERVAL_CHECK(m.is_object(), "each chat message must be a JSON object, got ", m.dump());
    prepared.push_back(alias_reasoning(m));
  }
  SERVAL_CHECK(tools.is_null() || tools.is_array(), "tools must be a JSON array, got ", tools.type_name());
  nlohmann::ordered_json vars = nlohmann::ordered_json::object();
  vars["messages"] = std::move(prepared);
  vars["tools"] = tools;
  vars["documents"] = nullptr;
  vars["add_generation_prompt"] = add_generation_prompt;
  if (tok) {
    nlohmann::ordered_json special = chat_template_special_tokens(*tok);
    for (auto it = special.begin(); it != special.end(); ++it) vars[it.key()] = it.value();
  }
  if (!extra.is_null()) {
    SERVAL_CHECK(extra.is_object(), "extra chat template variables must be a JSON object, got ", extra.type_name());
    for (auto it = extra.begin(); it != extra.end(); ++it) vars[it.key()] = it.value();
  }
  return vars;
}

}  // namespace serval
