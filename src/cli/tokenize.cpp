// `serval tokenize`: text -> token ids (JSON array), or ids -> text with --decode.
// --input FILE.jsonl processes one JSON value per line (a string to encode, or
// with --decode an array of ids) and prints one JSON result per line, so tests
// can check hundreds of strings with one process.
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace serval::cli {

namespace {

struct TokenizeOptions {
  std::string model;
  std::string text;
  std::string ids;
  std::string input;
  bool add_special = false;
  bool decode = false;
  bool skip_special = false;
};

using json = nlohmann::json;

std::vector<int32_t> parse_ids(const std::string& s) {
  json j;
  try {
    j = json::parse(s);
  } catch (const json::exception&) {
    fail("expected a JSON array of token ids, got: ", s);
  }
  SERVAL_CHECK(j.is_array(), "expected a JSON array of token ids, got: ", s);
  std::vector<int32_t> ids;
  for (const auto& v : j) {
    SERVAL_CHECK(v.is_number_integer(), "token ids must be integers, got ", v.dump());
    SERVAL_CHECK(v.is_number_unsigned() && v.get<uint64_t>() <= uint64_t(INT32_MAX), "token id ", v.dump(),
                 " is out of range");
    ids.push_back(int32_t(v.get<uint64_t>()));
  }
  return ids;
}

std::string ids_json(const std::vector<int32_t>& ids) { return json(ids).dump(); }

int run_batch(const Tokenizer& tok, const TokenizeOptions& o) {
  std::ifstream in(o.input);
  SERVAL_CHECK(in, "cannot open --input file \"", o.input, "\"");
  std::string line;
  size_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.empty()) continue;
    json j;
    try {
      j = json::parse(line);
    } catch (const json::exception& e) {
      fail(o.input, ":", line_no, ": not valid JSON: ", e.what());
    }
    if (o.decode) {
      std::string text = tok.decode(parse_ids(line), o.skip_special);
      std::cout << json(text).dump() << "\n";
    } else {
      SERVAL_CHECK(j.is_string(), o.input, ":", line_no, ": expected a JSON string");
      std::cout << ids_json(tok.encode(j.get<std::string>(), o.add_special)) << "\n";
    }
  }
  return 0;
}

int run_tokenize(const TokenizeOptions& o) {
  std::unique_ptr<Tokenizer> tok = load_tokenizer(o.model);
  if (!o.input.empty()) return run_batch(*tok, o);
  if (o.decode) {
    const std::string& src = o.ids.empty() ? o.text : o.ids;
    SERVAL_CHECK(!src.empty(), "--decode needs the ids as a JSON array in --ids or --text");
    std::cout << tok->decode(parse_ids(src), o.skip_special) << "\n";
    return 0;
  }
  std::cout << ids_json(tok->encode(o.text, o.add_special)) << "\n";
  return 0;
}

}  // namespace

void register_tokenize(CLI::App& app, Action& action) {
  auto opts = std::make_shared<TokenizeOptions>();
  auto* sub = app.add_subcommand("tokenize", "Print the token ids of a text (or the text of ids with --decode)");
  sub->add_option("--model,-m", opts->model, "a .gguf file, a folder with tokenizer.json, or a tokenizer.json")
      ->required();
  sub->add_option("--text,-t", opts->text, "the text to encode (with --decode: a JSON array of ids)");
  sub->add_option("--ids", opts->ids, "with --decode: the ids as a JSON array");
  sub->add_option("--input", opts->input, "a JSONL file: one JSON string (or id array with --decode) per line");
  sub->add_flag("--add-special", opts->add_special, "add BOS/EOS as the model's tokenizer does");
  sub->add_flag("--decode", opts->decode, "decode ids to text");
  sub->add_flag("--skip-special", opts->skip_special, "with --decode: leave out special tokens");
  sub->callback([opts, &action] { action = [opts] { return run_tokenize(*opts); }; });
}

}  // namespace serval::cli
