#pragma once
// Writing a tokenizer into GGUF metadata (tokenizer.ggml.* as llama.cpp reads
// them), for `serval convert` of Hugging Face folders. load_tokenizer() on the
// written file gives the same token ids as on the tokenizer.json.
#include <string>

namespace serval {

class GgufWriter;

// Reads `source` (a folder with tokenizer.json [+ tokenizer_config.json], or a
// tokenizer.json file) and sets the tokenizer.* keys on `w`. Throws
// serval::Error when the tokenizer cannot be expressed in GGUF (for example a
// pre-tokenizer regex llama.cpp has no name for).
void add_tokenizer_metadata(const std::string& source, GgufWriter& w);

}  // namespace serval
