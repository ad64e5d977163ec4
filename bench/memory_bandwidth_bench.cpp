// Measures this machine's memory bandwidth, the ceiling for CPU decode: a
// decode step reads every weight once, so tokens/s <= bandwidth / bytes per token.
// Counts bytes read + bytes written, as STREAM does.
#include <benchmark/benchmark.h>
#include <omp.h>

#include <cstdint>
#include <cstring>
#include <memory>

namespace {

constexpr size_t kBytes = size_t(1) << 30;  // 1 GiB per buffer: far past every cache

struct Buffers {
  std::unique_ptr<float[]> a{new float[kBytes / 4]}, b{new float[kBytes / 4]};
  Buffers() {
    const int64_t n = int64_t(kBytes / 4);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) { a[i] = float(i % 1000) * 0.5f; b[i] = 1.0f; }
  }
};

Buffers& buffers() { static Buffers b; return b; }

// Read-only: the access pattern of weight streaming during decode.
void BM_Read(benchmark::State& state) {
  const int64_t n = int64_t(kBytes / 4);
  const float* a = buffers().a.get();
  for (auto _ : state) {
    float sum = 0;
    // simd lets the compiler reassociate the sum into vector lanes, so the loads,
    // not the add latency, set the pace.
#pragma omp parallel for simd reduction(+ : sum) schedule(static)
    for (int64_t i = 0; i < n; ++i) sum += a[i];
    benchmark::DoNotOptimize(sum);
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(kBytes));
  state.counters["threads"] = omp_get_max_threads();
}
BENCHMARK(BM_Read)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(2.0);

void BM_Copy(benchmark::State& state) {
  const int64_t n = int64_t(kBytes / 4);
  const float* a = buffers().a.get();
  float* b = buffers().b.get();
  for (auto _ : state) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) b[i] = a[i];
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(2 * kBytes));
}
BENCHMARK(BM_Copy)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(2.0);

}  // namespace

BENCHMARK_MAIN();
