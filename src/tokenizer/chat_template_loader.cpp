// load_chat_template(model_path): the template stored with a model, without
// loading its whole tokenizer.
#include <filesystem>
#include <fstream>

#include "model/gguf.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/loader_util.h"

namespace serval {

namespace fs = std::filesystem;

std::string load_chat_template(const std::string& model_path, bool with_tools) {
  fs::path p(model_path);
  SERVAL_CHECK(fs::exists(p), "model path \"", model_path, "\" does not exist");
  fs::path config;
  if (fs::is_directory(p)) {
    config = p / "tokenizer_config.json";
  } else if (p.extension() == ".json") {
    config = p.parent_path() / "tokenizer_config.json";
  } else {
    auto gguf = GgufFile::open(model_path);
    std::string tool_use = with_tools ? gguf->get_string("tokenizer.chat_template.tool_use", "") : "";
    return tool_use.empty() ? gguf->get_string("tokenizer.chat_template", "") : tool_use;
  }
  if (!fs::exists(config)) return "";
  std::ifstream in(config);
  SERVAL_CHECK(in, "cannot open \"", config.string(), "\"");
  nlohmann::json cfg;
  try {
    cfg = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    fail("\"", config.string(), "\" is not valid JSON: ", e.what());
  }
  std::string tool_use = with_tools ? chat_template_from_config(cfg, "tool_use") : "";
  return tool_use.empty() ? chat_template_from_config(cfg) : tool_use;
}

}  // namespace serval
