// libFuzzer harness: GGUF parsing, ModelConfig from metadata, tensor type and
// shape validation. Every input must either load or throw serval::Error.
#include <cstddef>
#include <cstdint>

#include "core/error.h"
#include "model/gguf.h"
#include "model/gguf_model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    auto file = serval::GgufFile::parse(data, size, "fuzz");
    // Touch every metadata getter path the loaders use.
    for (const auto& [key, value] : file->metadata()) {
      (void)value.array_size();
      try { (void)file->get_float(key); } catch (const serval::Error&) {}
      try { (void)file->get_int_array(key); } catch (const serval::Error&) {}
    }
    serval::LoadedModel m = serval::load_gguf_model(file);
    (void)m;
  } catch (const serval::Error&) {
  }
  return 0;
}
