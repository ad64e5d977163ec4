#include "eval/calibration.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "eval/perplexity.h"
#include "model/model_loader.h"
#include "runtime/activation_recorder.h"
#include "runtime/model_runner.h"
#include "tokenizer/tokenizer.h"

namespace serval {

namespace {

// Offset of the first byte that breaks UTF-8, or -1.
int64_t utf8_error_at(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = uint8_t(s[i]);
    const int n = c < 0x80 ? 0 : (c >> 5) == 0x6 ? 1 : (c >> 4) == 0xE ? 2 : (c >> 3) == 0x1E ? 3 : -1;
    if (n < 0 || i + size_t(n) >= s.size()) return int64_t(i);  // a bad lead byte, or cut short
    for (int k = 1; k <= n; ++k)
      if ((uint8_t(s[i + size_t(k)]) & 0xC0) != 0x80) return int64_t(i);
    i += size_t(n) + 1;
  }
  return -1;
}

}  // namespace

std::string read_calibration_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  SERVAL_CHECK(in, "--calibration: cannot open \"", path, "\"");
  std::ostringstream s;
  s << in.rdbuf();
  std::string text = s.str();
  SERVAL_CHECK(!text.empty(), "--calibration: \"", path, "\" is empty");
  const size_t nul = text.find('\0');
  SERVAL_CHECK(nul == std::string::npos, "--calibration: \"", path, "\" is not text (a NUL byte at offset ", nul, ")");
  const int64_t bad = utf8_error_at(text);
  SERVAL_CHECK(bad < 0, "--calibration: \"", path, "\" is not UTF-8 text (byte ", bad, ")");
  return text;
}

CalibrationResult run_calibration(const std::string& model_path, const std::vector<std::string>& names,
                                  const CalibrationOptions& o) {
  SERVAL_CHECK(o.tokens >= 16, "--calibration-tokens must be at least 16, got ", o.tokens);
  SERVAL_CHECK(o.ctx >= 16, "--ctx must be at least 16 tokens, got ", o.ctx);
  const std::string text = read_calibration_text(o.file);
  LoadedModel m = load_model(model_path);
  const std::unique_ptr<Tokenizer> tok = load_tokenizer(model_path);
  std::vector<int32_t> tokens = tok->encode(text, /*add_special=*/true);
  SERVAL_CHECK(tokens.size() >= 16, "--calibration: \"", o.file, "\" is ", tokens.size(),
               " tokens; calibration needs at least 16");
  if (int64_t(tokens.size()) > o.tokens) tokens.resize(size_t(o.tokens));
  const int64_t ctx = std::min<int64_t>({o.ctx, int64_t(tokens.size()), m.config.max_position});
  const int64_t windows = int64_t(tokens.size()) / ctx;
  ActivationRecorder recorder(names, std::max<int64_t>(1, windows * ctx / std::max<int64_t>(o.max_rows, 1)));
  RunnerOptions ro;
  ro.device = "cpu";
  ro.dtype = "auto";  // f32 on the CPU
  ro.threads = o.threads;
  ro.kv_cache_tokens = (ctx + ro.block_size - 1) / ro.block_size * ro.block_size;
  ro.max_num_batched_tokens = ctx;
  ro.max_num_seqs = 1;
  ro.max_scored_rows = int32_t(ctx);
  ro.max_model_len = int32_t(ctx);
  ro.matmul_observer = &recorder;
  const std::unique_ptr<ModelRunner> runner = ModelRunner::create(m.config, m.weights, ro);
  PerplexityOptions po;
  po.ctx = ctx;
  po.max_chunks = windows;
  po.bos_id = tok->add_bos ? tok->bos_id : -1;
  const PerplexityResult r = perplexity(*runner, tokens, po);
  return {recorder.stats(), windows * ctx, r.perplexity()};
}

}  // namespace serval
