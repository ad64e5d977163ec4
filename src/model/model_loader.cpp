#include "model/model_loader.h"

#include <cstdlib>
#include <filesystem>

#include "core/error.h"
#include "model/gguf_model.h"
#include "model/hf_model.h"
#include "model/llama2c.h"

namespace serval {

namespace fs = std::filesystem;

LoadedModel load_model(const std::string& path) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st)) fail("model \"", path, "\" does not exist");
  if (fs::is_directory(st)) {
    if (!fs::exists(fs::path(path) / "config.json"))
      fail("model folder \"", path, "\" has no config.json (expected a Hugging Face model folder)");
    return load_hf_model(path);
  }
  if (fs::path(path).extension() == ".bin") return load_llama2c_model(path);
  return load_gguf_model(path);
}

std::string models_dir() {
  const char* env = std::getenv("SERVAL_MODELS");
  return env && *env ? env : "../shared/models";
}

}  // namespace serval
