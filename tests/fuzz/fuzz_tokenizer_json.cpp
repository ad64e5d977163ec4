// libFuzzer harness: a Hugging Face tokenizer.json (a model folder is
// untrusted input), loaded as `serval --model FOLDER` does, then used: texts
// encoded with and without special tokens, ids decoded whole and streamed.
// Every input must load and work or throw serval::Error; anything else is a bug.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace {

std::string g_path;  // the input, written where load_tokenizer reads a file

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* tmp = std::getenv("TMPDIR");
  g_path = std::string(tmp ? tmp : "/tmp") + "/serval-fuzz-tokenizer-" + std::to_string(getpid()) + ".json";
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  {
    std::ofstream f(g_path, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(data), std::streamsize(size));
  }
  try {
    const auto tok = serval::load_tokenizer(g_path);
    const int32_t n = tok->vocab_size();
    for (const char* text : {"Hello world", " a  b\n\nc", "abcab<eos>ca", "<s>x</s>", "h\xc3\xa9llo \xe4\xb8\xad\xf0\x9f\x98\x80",
                             "\xff\xfe bad utf-8", ""}) {
      for (const bool special : {false, true}) {
        const std::vector<int32_t> ids = tok->encode(text, special);
        (void)tok->decode(ids, true);
        (void)tok->decode(ids, false);
      }
    }
    std::vector<int32_t> all;
    for (int32_t id = 0; id < n && id < 300; ++id) all.push_back(id);
    all.push_back(n);  // past the vocabulary: decodes to nothing
    (void)tok->decode(all, false);
    serval::IncrementalDetokenizer stream(*tok, /*skip_special=*/true, /*first_in_text=*/true);
    for (const int32_t id : all) (void)stream.push(id);
    (void)stream.flush();
  } catch (const serval::Error&) {
  }
  return 0;
}
