// The GPU sampler (CudaBackend::sample) against the CPU Sampler
// (sampling/sampler.h) on the same f32 logits, and against a naive
// sort-based reference of the same semantics for exact distributions.
// Skips without a GPU.
//
// The sampled and logprobs checks run twice: with the sampler's shared-memory
// candidate lists (what rows with few candidates take) and without (the radix
// passes to the end, what rows with many candidates take).
//
// Draw checks use stratified uniforms u_i = (i + 0.5) / N: for any fixed walk
// order over the kept tokens, token t is then drawn N * p_t times up to +-1,
// so the GPU's histogram (walked in its own order) and the CPU's both lie
// within ~2/N of the exact distribution.
#include "cuda_sampling_test_util.h"

namespace serval::testing {
namespace {

TEST(CudaSampling, GreedyMatchesCpuExactly) {
  SERVAL_CUDA_OR_SKIP(gpu);
  Sampler sampler;
  const char* variants[] = {"plain",    "bans",          "repetition", "frequency",
                            "presence", "all penalties", "logit bias", "allowed mask"};
  for (int64_t vocab : {kMidVocab, kLargeVocab}) {
    for (int rows : {1, 7, kMaxRows}) {
      for (int variant = 0; variant < 8; ++variant) {
        std::vector<float> host = random_logits(rows, vocab, uint32_t(vocab + rows * 7 + variant));
        plant_max_ties(host, rows, vocab, uint32_t(rows + variant));
        std::mt19937 rng(uint32_t(variant * 1000 + rows));
        std::vector<Request> reqs(static_cast<size_t>(rows));
        for (int r = 0; r < rows; ++r) {
          Request& q = reqs[size_t(r)];
          q.row = r;
          q.params = greedy_params();
          float* row = host.data() + int64_t(r) * vocab;
          const int32_t top = argmax_of(row, vocab);
          auto some_ids = [&](int n, std::vector<int32_t>& into) {
            for (int i = 0; i < n; ++i) into.push_back(int32_t(rng() % uint32_t(vocab)));
          };
          const bool odd = r % 2 == 1;  // even rows stay plain: both kernels run in one call
          if (variant == 1 && odd) {
            q.banned = {top, int32_t(vocab + 5), -1};  // out-of-vocabulary bans are ignored
            some_ids(3, q.banned);
          }
          if (variant == 2 && odd) {
            q.params.repetition_penalty = 2.0f;
            some_ids(50, q.prompt);
            q.prompt.push_back(top);
            // A prompt token at exactly twice a positive max ties with it after
            // the penalty.
            const int32_t twin = int32_t(rng() % uint32_t(vocab));
            if (row[top] > 0 && twin != top) {
              row[twin] = 2.0f * row[top];
              q.prompt.push_back(twin);
            }
          }
          if (variant == 3 && odd) {
            q.params.frequency_penalty = (r % 4 == 1) ? 0.5f : -0.75f;  // exact products: no FMA dependence
            some_ids(40, q.output);
            q.output.push_back(top);
            q.output.push_back(top);
          }
          if (variant == 4 && odd) {
            q.params.presence_penalty = 1.5f;
            some_ids(20, q.output);
          }
          if ((variant == 3 || variant == 4) && odd) {
            // Every token at the max is in the output; a prompt-only runner-up
            // just below it must not be penalized, so it wins when they are.
            const float m = row[top];
            for (int64_t id = 0; id < vocab; ++id)
              if (row[id] == m) q.output.push_back(int32_t(id));
            int32_t runner = int32_t(rng() % uint32_t(vocab));
            while (row[runner] == m) runner = int32_t((runner + 1) % vocab);
            row[runner] = m - 0.01f;
            q.prompt.push_back(runner);
          }
          if (variant == 7 && odd) {
            // Structured output: about one token in 8 allowed, never the max;
            // with a bias on some rows (the mask wins over it).
            q.allowed.assign(size_t((vocab + 31) / 32), 0u);
            for (int64_t id = 0; id < vocab; ++id)
              if (id != top && rng() % 8 == 0) q.allowed[size_t(id / 32)] |= 1u << (id % 32);
            if (r % 4 == 3) q.params.logit_bias = {{top, 50.0f}};
          }
          if (variant == 6 && odd) {
            // A bias that lifts a runner-up over the max, one that sinks the
            // max, and a repetition penalty after them (vLLM's order).
            const int32_t lift = int32_t(rng() % uint32_t(vocab));
            q.params.logit_bias = {{lift, row[top] - row[lift] + 0.5f}};
            if (lift != top) q.params.logit_bias.push_back({top, -100.0f});
            if (r % 4 == 1) {
              q.params.repetition_penalty = 1.5f;
              q.prompt = {lift};
            }
          }
          if (variant == 5 && odd) {
            q.params.repetition_penalty = 1.25f;
            q.params.frequency_penalty = 0.25f;
            q.params.presence_penalty = -0.5f;
            some_ids(30, q.prompt);
            some_ids(30, q.output);
            q.output.push_back(top);
            q.banned = {int32_t(rng() % uint32_t(vocab))};
          }
        }
        const DeviceLogits dev = to_device(*gpu, host, rows, vocab);
        const std::vector<SampleResult> g = gpu_sample(*gpu, dev.t, reqs);
        int mismatches = 0, first_bad = -1;
        for (int r = 0; r < rows; ++r) {
          const int32_t want = cpu_sample(sampler, host, vocab, reqs[size_t(r)]).token;
          if (g[size_t(r)].token != want) {
            if (first_bad < 0) first_bad = r;
            ++mismatches;
          }
        }
        std::printf("[cuda sampling] greedy vocab %lld rows %d %-13s: %d mismatches\n", (long long)vocab, rows,
                    variants[variant], mismatches);
        EXPECT_EQ(mismatches, 0) << "vocab " << vocab << " rows " << rows << " " << variants[variant]
                                 << ", first at row " << first_bad;
      }
    }
  }
}

// A start whose penalized specs name a token of the start before
// (SampleSpec::fed_source, queued before that start is finished) counts it as
// the CPU counts an output token: every token equals the CPU sampler's with
// the fed token appended to the output. The fed tokens are read before this
// start's kernels overwrite them: plain greedy specs of the same start write
// the slots the fed ones read, and the second start has more specs than the
// token array holds (it grows). Each penalized row's fed token and a
// runner-up lead the rest, so that counting the fed token or not picks the
// other one.
TEST(CudaSampling, FedTokensCountInTheNextStartsPenalties) {
  SERVAL_CUDA_OR_SKIP(gpu);
  Sampler sampler;
  const int64_t vocab = 1000;
  for (const int rows : {6, 1500}) {
    const int first_rows = std::min(rows, 1024);
    std::vector<float> first = random_logits(first_rows, vocab, uint32_t(rows));
    std::vector<int32_t> fed_of(static_cast<size_t>(first_rows));  // start 1's greedy tokens
    for (int r = 0; r < first_rows; ++r) fed_of[size_t(r)] = argmax_of(first.data() + int64_t(r) * vocab, vocab);
    std::vector<float> second = random_logits(rows, vocab, uint32_t(rows + 1));
    std::mt19937 rng{uint32_t(rows)};
    // Spec k of start 2: even k plain greedy (writing token slot k), odd k
    // penalized and fed from start 1's spec (k + 1) % first_rows, which an
    // even spec of start 2 overwrites.
    std::vector<Request> reqs(static_cast<size_t>(rows));
    std::vector<int32_t> sources(static_cast<size_t>(rows), -1);
    for (int k = 0; k < rows; ++k) {
      Request& q = reqs[size_t(k)];
      q.row = rows - 1 - k;
      q.params = greedy_params();
      if (k % 2 == 0) continue;
      const int32_t src = int32_t((k + 1) % first_rows);
      const int32_t f = fed_of[size_t(src)];
      sources[size_t(k)] = src;
      float* row = second.data() + int64_t(q.row) * vocab;
      const float m = *std::max_element(row, row + vocab);
      row[f] = m + 1.0f;
      const int32_t runner = int32_t((f + 1 + int32_t(rng() % uint32_t(vocab - 1))) % vocab);
      row[runner] = m + 0.75f;
      switch (k % 10) {
        case 1:  // f new to the output: frequency and presence count it once
          q.params.frequency_penalty = 0.25f;
          q.params.presence_penalty = 0.5f;
          break;
        case 3:  // f in the output twice already: a third count
          q.params.frequency_penalty = 0.125f;
          q.output = {f, f};
          row[runner] = m + 0.7f;
          break;
        case 5:  // f in the prompt only: now in the output too
          q.params.presence_penalty = 0.5f;
          q.prompt = {f, runner};
          break;
        case 7:  // f seen now: repetition
          q.params.repetition_penalty = 2.0f;
          break;
        default:  // a negative frequency penalty lifts f above the runner-up
          q.params.frequency_penalty = -0.5f;
          row[runner] = m + 1.25f;
          break;
      }
    }
    const DeviceLogits dev1 = to_device(*gpu, first, first_rows, vocab);
    const DeviceLogits dev2 = to_device(*gpu, second, rows, vocab);
    std::vector<SampleSpec> specs1(static_cast<size_t>(first_rows));
    const SamplingParams greedy = greedy_params();
    for (int r = 0; r < first_rows; ++r) specs1[size_t(r)] = SampleSpec{r, &greedy, {}, {}, {}, 0.0};
    std::vector<SampleSpec> specs2(static_cast<size_t>(rows));
    for (int k = 0; k < rows; ++k) {
      const Request& q = reqs[size_t(k)];
      specs2[size_t(k)] = SampleSpec{q.row, &q.params, q.prompt, q.output, q.banned, q.uniform};
      specs2[size_t(k)].fed_source = sources[size_t(k)];
    }
    gpu->start_sample(dev1.t, specs1);
    gpu->start_sample(dev2.t, specs2);
    std::vector<SampleResult> out1, out2;
    gpu->finish_sample(out1);
    gpu->finish_sample(out2);
    ASSERT_EQ(out1.size(), size_t(first_rows));
    for (int r = 0; r < first_rows; ++r) ASSERT_EQ(out1[size_t(r)].token, fed_of[size_t(r)]) << "row " << r;
    ASSERT_EQ(out2.size(), size_t(rows));
    int mismatches = 0, fed_changed = 0;
    for (int k = 0; k < rows; ++k) {
      Request q = reqs[size_t(k)];
      if (sources[size_t(k)] >= 0) {
        const int32_t uncounted = cpu_sample(sampler, second, vocab, q).token;
        q.output.push_back(fed_of[size_t(sources[size_t(k)])]);
        fed_changed += cpu_sample(sampler, second, vocab, q).token != uncounted;
      }
      const int32_t want = cpu_sample(sampler, second, vocab, q).token;
      if (out2[size_t(k)].token != want && mismatches++ == 0)
        ADD_FAILURE() << rows << " rows: spec " << k << " drew " << out2[size_t(k)].token << ", the CPU " << want;
    }
    std::printf("[cuda sampling] fed tokens, %d specs after %d: %d mismatches; counting the fed token changes %d of %d\n",
                rows, first_rows, mismatches, fed_changed, rows / 2);
    EXPECT_EQ(mismatches, 0);
    EXPECT_EQ(fed_changed, rows / 2) << "a case where the fed token does not matter";
  }
  // A fed source the start before did not have is refused before anything runs.
  const DeviceLogits dev = to_device(*gpu, random_logits(1, vocab, 3u), 1, vocab);
  SamplingParams penalized = greedy_params();
  penalized.repetition_penalty = 1.2f;
  SampleSpec spec{0, &penalized, {}, {}, {}, 0.0};
  spec.fed_source = 1;
  std::vector<SampleResult> out;
  gpu->start_sample(dev.t, {&spec, 1});  // the start before (above) had 1500 specs: fine
  spec.fed_source = 2;
  EXPECT_THROW(gpu->start_sample(dev.t, {&spec, 1}), Error);
  gpu->finish_sample(out);
  EXPECT_THROW(gpu->sample(dev.t, {&spec, 1}, out), Error) << "sample() takes no fed tokens";
}

// ---------------------------------------------------------------- sampled

// swapped (tasks of the same size, other bytes), then those again.
TEST(CudaSampling, RepeatedTasksSampleTheNewLogits) {
  SERVAL_CUDA_OR_SKIP(gpu);
  const int64_t rows = 3;
  std::vector<Request> reqs(static_cast<size_t>(rows));
  for (int r = 0; r < rows; ++r) {
    reqs[size_t(r)].row = r;
    reqs[size_t(r)].params = greedy_params();
  }
  for (int call = 0; call < 6; ++call) {
    if (call == 2 || call == 4) std::swap(reqs[0].row, reqs[2].row);
    const std::vector<float> host = random_logits(rows, kMidVocab, uint32_t(100 + call));
    DeviceLogits d = to_device(*gpu, host, rows, kMidVocab);
    const std::vector<SampleResult> out = gpu_sample(*gpu, d.t, reqs);
    for (size_t i = 0; i < reqs.size(); ++i)
      EXPECT_EQ(out[i].token, argmax_of(host.data() + int64_t(reqs[i].row) * kMidVocab, kMidVocab))
          << "call " << call << ", spec " << i;
  }
}


}  // namespace
}  // namespace serval::testing
