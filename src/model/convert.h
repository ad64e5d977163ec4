#pragma once
// Conversion to GGUF (`serval convert`): llama2.c checkpoints and Hugging Face
// folders, with llama.cpp's metadata keys so that the files also load in llama.cpp.
#include <string>

#include "model/gguf.h"
#include "model/llama2c.h"
#include "model/model_config.h"

namespace serval {

// `input` is a folder with config.json (Hugging Face) or a llama2.c .bin file
// (then `tokenizer` is its tokenizer.bin; empty means tokenizer.bin beside it).
void convert_to_gguf(const std::string& input, const std::string& tokenizer, const std::string& out_path);

void convert_llama2c_to_gguf(const std::string& bin_path, const std::string& tokenizer_path,
                             const std::string& out_path);
void convert_hf_to_gguf(const std::string& dir, const std::string& out_path);

// llama.cpp's general.file_type (LLAMA_FTYPE_*) for the dtype of the big matrices.
uint32_t gguf_file_type_of(DType t);

// `{arch}.*` hyperparameters (and llama3 rope scaling keys) of `c`.
void set_gguf_model_metadata(GgufWriter& w, const ModelConfig& c);

// tokenizer.ggml.* from a llama2.c vocabulary (SentencePiece pieces with byte tokens).
void set_gguf_tokenizer_from_llama2c(GgufWriter& w, const Llama2cVocab& vocab);

// llama.cpp token types.
enum class GgufTokenType : int32_t { Normal = 1, Unknown = 2, Control = 3, UserDefined = 4, Unused = 5, Byte = 6 };

}  // namespace serval
