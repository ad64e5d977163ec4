#pragma once
// Helpers for the CUDA backend tests: they run each op on the CPU backend and
// on the CUDA backend with the same inputs (rounded to bf16 first, so both see
// identical values) and compare. Without a CUDA build or device they skip.
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/model_config.h"
#include "runtime/backend.h"

namespace serval::testing {

// The CUDA backend, or null when this build or machine has none.
std::unique_ptr<Backend> try_cuda_backend();

#define SERVAL_CUDA_OR_SKIP(var)                                                     \
  std::unique_ptr<::serval::Backend> var = ::serval::testing::try_cuda_backend();    \
  if (!var) GTEST_SKIP() << "no CUDA backend in this build or no CUDA device here"

// n values ~ U(-scale, scale), rounded to bf16.
std::vector<float> random_bf16(size_t n, uint32_t seed, float scale = 1.0f);

// A tensor in a backend's activation dtype holding `values`; keeps its memory.
struct DevTensor {
  DeviceBuffer buf;
  Tensor t;
};
DevTensor upload(Backend& be, const std::vector<float>& values, int64_t rows, int64_t cols);
DevTensor zeros(Backend& be, int64_t rows, int64_t cols);
std::vector<float> download(Backend& be, const Tensor& t);
// Integer arrays (token ids, positions, ...) in device memory.
template <typename T>
DeviceBuffer upload_ints(Backend& be, const std::vector<T>& v) {
  DeviceBuffer b = be.alloc(int64_t(v.size() * sizeof(T)) + 64);
  be.copy_to_device(b.data(), v.data(), int64_t(v.size() * sizeof(T)));
  return b;
}
// max |a - b| / max |b|.
double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b);

// Matrix products for the matmul tests: a weight [rows, cols] from f32 values
// (the backend converts it), y [T, out] = x [T, in] @ w [out, in]^T in double,
// and max |got - want| / max |want| over the first n values of want.
std::unique_ptr<DeviceWeight> upload_matrix(Backend& be, const std::string& name, int64_t rows, int64_t cols,
                                            const std::vector<float>& values);
std::vector<double> reference_matmul(const std::vector<float>& x, int64_t T, const std::vector<float>& w,
                                     int64_t out, int64_t in);
double rel_err(const std::vector<float>& got, const std::vector<double>& want, size_t n);
// x [T, in] as the packed GEMV's int8 path sees it (1 or 2 rows,
// CudaTuning::packed_int8_x): each group of 32 columns scaled by 127 / max|x|,
// rounded to nearest even, times max|x| / 127 (the same f32 operations).
std::vector<float> int8_x(const std::vector<float>& x, int64_t T, int64_t in);
// The worst over (token, head) of max |got - want| / max |want| within that
// head's head_dim values (1e30 when the sizes differ).
double worst_head_error(const std::vector<float>& got, const std::vector<float>& want, int32_t head_dim);

// The RoPE variants the op tests compare with the CPU: both styles, a partial
// rotary dim, head_dim 8, and no / llama3 / linear scaling.
struct RopeCase {
  RopeStyle style;
  int64_t head_dim, rope_dim;
  RopeScaling::Type scaling;
};
std::vector<RopeCase> rope_cases();
// The inverse frequencies of a case: theta 500000; scaling factor 8, llama3's
// low / high frequency factors 1 / 4 over 8192 original positions.
std::vector<float> rope_case_inv_freq(const RopeCase& c);

}  // namespace serval::testing
