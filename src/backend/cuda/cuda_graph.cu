// CUDA graphs for the CUDA backend (CudaDevice): the stream's work between begin_capture()
// and end_capture() is recorded into a graph and instantiated once; replay()
// launches it with one call instead of one launch per kernel.
#include "backend/cuda/cuda_device.h"

namespace serval::cuda {

namespace {

class CudaGraph : public DeviceGraph {
 public:
  CudaGraph(cudaGraphExec_t exec, const CudaDevice& dev) : exec_(exec), dev_(dev) {}
  ~CudaGraph() override { cudaGraphExecDestroy(exec_); }
  void replay() override {
    dev_.bind();
    SERVAL_CUDA_CHECK(cudaGraphLaunch(exec_, dev_.stream()));
  }

 private:
  cudaGraphExec_t exec_;
  const CudaDevice& dev_;
};

}  // namespace

void CudaDevice::begin_capture() {
  bind();
  SERVAL_CHECK(!capturing_, "cuda backend: begin_capture() while a capture is in progress");
  // Thread-local mode: other threads' CUDA calls (e.g. the server's) are not
  // affected by this capture, and ours fail loudly if they would break it.
  SERVAL_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  capturing_ = true;
}

std::unique_ptr<DeviceGraph> CudaDevice::end_capture() {
  bind();
  SERVAL_CHECK(capturing_, "cuda backend: end_capture() without begin_capture()");
  capturing_ = false;
  cudaGraph_t graph = nullptr;
  SERVAL_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t err = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  SERVAL_CHECK(err == cudaSuccess, "cuda backend: cannot instantiate the captured graph: ", cudaGetErrorString(err));
  return std::make_unique<CudaGraph>(exec, *this);
}

}  // namespace serval::cuda
