#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/pretokenizer_regex.h"

#include <pcre2.h>

#include <mutex>

#include "core/error.h"
#include "tokenizer/work_count.h"

namespace serval {

const char* const kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const char* const kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kSmolLMPattern =
    R"(\p{N}|'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?[^\s\p{L}\p{N}]+|\s+(?![^\s\p{N}])|\s+)";

namespace {

pcre2_code* compile(const std::string& pattern, uint32_t options) {
  int err = 0;
  PCRE2_SIZE err_off = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP | options, &err, &err_off, nullptr);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    fail("pre-tokenizer regex does not compile at offset ", err_off, ": ", reinterpret_cast<char*>(msg),
         " (pattern ", pattern, ")");
  }
  return code;
}

int count_step(pcre2_callout_block*, void* steps) {
  ++*static_cast<int64_t*>(steps);
  return 0;
}

}  // namespace

struct PretokenizerRegex::Impl {
  pcre2_code* code = nullptr;
  // The pattern with a callout before every item, for counting work
  // (work_count.h); compiled at the first counted split, so only tests pay.
  std::once_flag counted_once;
  pcre2_code* counted = nullptr;
  ~Impl() {
    if (code) pcre2_code_free(code);
    if (counted) pcre2_code_free(counted);
  }
};

PretokenizerRegex::PretokenizerRegex(const std::string& pattern) : pattern_(pattern), impl_(new Impl) {
  impl_->code = compile(pattern, 0);
  // JIT is an optimisation only; the interpreter is used when it is unavailable.
  pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE);
}

PretokenizerRegex::~PretokenizerRegex() = default;

std::vector<std::string_view> PretokenizerRegex::split(std::string_view text) const {
  std::vector<std::string_view> out;
  pcre2_code* code = impl_->code;
  std::unique_ptr<pcre2_match_context, decltype(&pcre2_match_context_free)> context(nullptr,
                                                                                   &pcre2_match_context_free);
  if (TokenizerWork* work = tokenizer_work()) {
    std::call_once(impl_->counted_once, [&] { impl_->counted = compile(pattern_, PCRE2_AUTO_CALLOUT); });
    code = impl_->counted;
    context.reset(pcre2_match_context_create(nullptr));
    pcre2_set_callout(context.get(), count_step, &work->regex_steps);
  }
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> md(
      pcre2_match_data_create_from_pattern(code, nullptr), &pcre2_match_data_free);
  auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0, gap_start = 0;
  while (pos < text.size()) {
    // The text was validated once by the caller; skip PCRE2's check per call.
    int rc = pcre2_match(code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, md.get(), context.get());
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
      rc = pcre2_match(code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      fail("pre-tokenizer regex failed: ", reinterpret_cast<char*>(msg));
    }
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
    size_t start = ov[0], end = ov[1];
    if (end == start) {  // empty match: step over one character
      pos = start + 1;
      while (pos < text.size() && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80) ++pos;
      continue;
    }
    if (start > gap_start) out.push_back(text.substr(gap_start, start - gap_start));
    out.push_back(text.substr(start, end - start));
    pos = gap_start = end;
  }
  if (gap_start < text.size()) out.push_back(text.substr(gap_start));
  return out;
}

}  // namespace serval
