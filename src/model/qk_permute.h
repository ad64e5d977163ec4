#pragma once
// The q/k row permutation between the two RoPE orders (model_config.h's
// RopeStyle): Hugging Face's rotate_half (Neox) rotates rows (i, i + r/2) of
// a head together, llama.cpp's "llama" GGUF and our fused kernels adjacent
// rows (2i, 2i + 1). Permuting every q and k head alike leaves attention's
// scores unchanged, so a model can be run in either order.
#include <cstdint>

namespace serval {

// Within each of n_head heads of head_dim rows, rows (j * half + i) -> (2i + j)
// for i < half = rope_dim / 2 (the rotated rows); rows from rope_dim on keep
// their place. rope_dim 0: head_dim (what llama.cpp's convert_hf_to_gguf does).
// `src` and `dst` hold n_head * head_dim rows of `row_bytes` each (a vector's
// elements are rows of one element).
void permute_qk_rows(const void* src, void* dst, int64_t n_head, int64_t head_dim, int64_t row_bytes,
                     int64_t rope_dim = 0);

}  // namespace serval
