#pragma once
// The calibration half of `serval quantize --calibration`: a MatmulObserver
// that keeps the statistics of the inputs of some matmuls (model/awq.h's
// ChannelStats), by weight name, while a CPU runner goes over a text.
#include <map>
#include <set>
#include <string>
#include <vector>

#include "model/awq.h"
#include "runtime/backend.h"

namespace serval {

class ActivationRecorder : public MatmulObserver {
 public:
  // Records the inputs of `names`, keeping every `stride`-th row of each.
  ActivationRecorder(const std::vector<std::string>& names, int64_t stride);
  void on_matmul_input(const std::string& weight, const float* x, int64_t rows, int64_t cols) override;
  const std::map<std::string, ChannelStats>& stats() const { return stats_; }

 private:
  std::set<std::string> names_;
  int64_t stride_;
  std::map<std::string, ChannelStats> stats_;
};

}  // namespace serval
