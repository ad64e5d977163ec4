#include "tokenizer/unicode_nfc.h"

#include <unicode/normalizer2.h>
#include <unicode/unistr.h>

#include "core/error.h"

namespace serval {

std::string nfc_normalize(std::string_view text) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* nfc = icu::Normalizer2::getNFCInstance(status);
  SERVAL_CHECK(U_SUCCESS(status), "ICU NFC normalizer unavailable: ", u_errorName(status));
  icu::UnicodeString src = icu::UnicodeString::fromUTF8(icu::StringPiece(text.data(), static_cast<int32_t>(text.size())));
  // Most text is already NFC; skip the copy then.
  if (nfc->isNormalized(src, status) && U_SUCCESS(status)) return std::string(text);
  status = U_ZERO_ERROR;
  icu::UnicodeString dst = nfc->normalize(src, status);
  SERVAL_CHECK(U_SUCCESS(status), "NFC normalization failed: ", u_errorName(status));
  std::string out;
  dst.toUTF8String(out);
  return out;
}

}  // namespace serval
