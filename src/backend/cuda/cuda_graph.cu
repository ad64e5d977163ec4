// CUDA graphs for the CUDA backend: the stream's work between begin_capture()
// and end_capture() is recorded into a graph and instantiated once; replay()
// launches it with one call instead of one launch per kernel.
#include "backend/cuda/cuda_backend.h"

namespace serval::cuda {

namespace {

class CudaGraph : public DeviceGraph {
 public:
  CudaGraph(cudaGraphExec_t exec, cudaStream_t stream) : exec_(exec), stream_(stream) {}
  ~CudaGraph() override { cudaGraphExecDestroy(exec_); }
  void replay() override { SERVAL_CUDA_CHECK(cudaGraphLaunch(exec_, stream_)); }

 private:
  cudaGraphExec_t exec_;
  cudaStream_t stream_;
};

}  // namespace

void CudaBackend::begin_capture() {
  SERVAL_CHECK(!capturing_, "cuda backend: begin_capture() while a capture is in progress");
  // Thread-local mode: other threads' CUDA calls (e.g. the server's) are not
  // affected by this capture, and ours fail loudly if they would break it.
  SERVAL_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  capturing_ = true;
}

std::unique_ptr<DeviceGraph> CudaBackend::end_capture() {
  SERVAL_CHECK(capturing_, "cuda backend: end_capture() without begin_capture()");
  capturing_ = false;
  cudaGraph_t graph = nullptr;
  SERVAL_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t err = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  SERVAL_CHECK(err == cudaSuccess, "cuda backend: cannot instantiate the captured graph: ", cudaGetErrorString(err));
  return std::make_unique<CudaGraph>(exec, stream_);
}

}  // namespace serval::cuda
