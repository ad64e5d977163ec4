#include "model/weights.h"

#include <sstream>

#include "core/error.h"

namespace serval {

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string TensorView::shape_str() const { return shape_string(shape); }

std::string shape_string(const std::vector<int64_t>& shape) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << ']';
  return os.str();
}

int64_t tensor_nbytes(DType dtype, const std::vector<int64_t>& shape, const std::string& name) {
  // Block-quantized types pack each innermost row separately, so the byte count
  // is (number of rows) x (bytes of one row).
  int64_t row = shape.empty() ? 1 : shape.back();
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < shape.size(); ++i) {
    SERVAL_CHECK(shape[i] >= 0, "tensor \"", name, "\" has a negative dimension: ", shape_string(shape));
    SERVAL_CHECK(!__builtin_mul_overflow(rows, shape[i], &rows), "tensor \"", name,
                 "\" is too large: ", shape_string(shape));
  }
  SERVAL_CHECK(row >= 0, "tensor \"", name, "\" has a negative dimension: ", shape_string(shape));
  if (row % dtype_block_elems(dtype) != 0)
    fail("tensor \"", name, "\" of type ", dtype_name(dtype), " needs rows of a multiple of ",
         dtype_block_elems(dtype), " elements, got shape ", shape_string(shape));
  int64_t total = 0;
  SERVAL_CHECK(!__builtin_mul_overflow(rows, dtype_bytes(dtype, row), &total), "tensor \"", name,
               "\" is too large: ", shape_string(shape));
  return total;
}

void WeightStore::add(TensorView view) {
  SERVAL_CHECK(!view.name.empty(), "weight store: tensor without a name");
  SERVAL_CHECK(!tensors_.count(view.name), "weight store: duplicate tensor \"", view.name, "\"");
  const int64_t expected = tensor_nbytes(view.dtype, view.shape, view.name);
  SERVAL_CHECK(view.nbytes == expected, "tensor \"", view.name, "\" (", dtype_name(view.dtype), " ",
               view.shape_str(), ") should take ", expected, " bytes, got ", view.nbytes);
  SERVAL_CHECK(view.data != nullptr || view.nbytes == 0, "tensor \"", view.name, "\" has no data");
  std::string name = view.name;
  tensors_.emplace(std::move(name), std::move(view));
}

void WeightStore::add_owned(std::string name, DType dtype, std::vector<int64_t> shape,
                            std::vector<uint8_t> bytes) {
  auto owned = std::make_shared<std::vector<uint8_t>>(std::move(bytes));
  TensorView v;
  v.name = std::move(name);
  v.dtype = dtype;
  v.shape = std::move(shape);
  v.data = owned->data();
  v.nbytes = int64_t(owned->size());
  add(std::move(v));
  keep_alive(owned);
}

const TensorView* WeightStore::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

const TensorView& WeightStore::get(const std::string& name) const {
  const TensorView* t = find(name);
  if (!t) fail("missing tensor \"", name, "\"");
  return *t;
}

const TensorView& WeightStore::get(const std::string& name, const std::vector<int64_t>& expected_shape) const {
  const TensorView& t = get(name);
  if (t.shape != expected_shape)
    fail("tensor \"", name, "\" has shape ", t.shape_str(), ", expected ", shape_string(expected_shape));
  return t;
}

}  // namespace serval
