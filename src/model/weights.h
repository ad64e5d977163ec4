#pragma once
// WeightStore: named, typed views of a model's tensors, whatever file they came
// from. Names are GGUF's (llama.cpp's) tensor names, which the loaders map to:
//   token_embd.weight, output_norm.weight, output.weight,
//   blk.N.{attn_norm,attn_q,attn_k,attn_v,attn_output,ffn_norm,ffn_gate,ffn_up,ffn_down}.weight,
//   blk.N.attn_{q,k,v}.bias (qwen2), blk.N.attn_{q,k}_norm.weight (qwen3).
// Shapes are outermost first (PyTorch order): a linear layer's weight is {out, in},
// stored row-major, so row o holds the `in` weights of output o.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace serval {

struct TensorView {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // borrowed: kept alive by the WeightStore that holds it
  int64_t nbytes = 0;

  int64_t numel() const;
  std::string shape_str() const;  // "[4096, 4096]"
};

// "[4096, 4096]"
std::string shape_string(const std::vector<int64_t>& shape);
// Bytes a tensor of this dtype and outermost-first shape takes (rows of the innermost
// dimension, each a whole number of blocks); throws naming `name` when the innermost
// dimension is not a multiple of the block size or the size overflows.
int64_t tensor_nbytes(DType dtype, const std::vector<int64_t>& shape, const std::string& name);

class WeightStore {
 public:
  // Adds a tensor; throws if the name is already present or nbytes does not match
  // dtype and shape.
  void add(TensorView view);
  // Keeps `owner` (an mmap, a buffer) alive as long as this store.
  void keep_alive(std::shared_ptr<const void> owner) { owners_.push_back(std::move(owner)); }
  // Stores a copy of `bytes` and adds a view of it (for converted or generated tensors).
  void add_owned(std::string name, DType dtype, std::vector<int64_t> shape, std::vector<uint8_t> bytes);

  const TensorView* find(const std::string& name) const;
  // Throws `missing tensor "NAME"` when absent.
  const TensorView& get(const std::string& name) const;
  // Throws naming the tensor, the expected and the actual shape when they differ.
  const TensorView& get(const std::string& name, const std::vector<int64_t>& expected_shape) const;
  const std::map<std::string, TensorView>& all() const { return tensors_; }
  size_t size() const { return tensors_.size(); }

 private:
  std::map<std::string, TensorView> tensors_;
  std::vector<std::shared_ptr<const void>> owners_;
};

}  // namespace serval
