#include "runtime/activation_recorder.h"

#include "core/error.h"

namespace serval {

ActivationRecorder::ActivationRecorder(const std::vector<std::string>& names, int64_t stride)
    : names_(names.begin(), names.end()), stride_(stride) {
  SERVAL_CHECK(stride >= 1, "calibration: a row stride of ", stride);
}

void ActivationRecorder::on_matmul_input(const std::string& weight, const float* x, int64_t rows, int64_t cols) {
  if (!names_.contains(weight)) return;
  ChannelStats& s = stats_[weight];
  s.stride = stride_;
  s.add(x, rows, cols);
}

}  // namespace serval
