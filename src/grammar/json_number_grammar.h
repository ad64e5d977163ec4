#pragma once
// JSON numbers within bounds, exactly, by digit-range construction: the
// decimal texts of the integers in [lo, hi] (no leading zeros, no "-0"), and
// decimal numbers (no exponent) between inclusive or exclusive bounds.
#include <cstdint>
#include <optional>
#include <string>

#include "grammar/grammar.h"

namespace serval::grammar {

// A decimal bound: sign, integer digits (canonical, "0" for zero) and
// fraction digits (no trailing zeros).
struct Decimal {
  bool negative = false;
  std::string int_digits = "0";
  std::string frac_digits;
  // From a JSON number's shortest round-trip text ("12", "-0.5", "1e-07").
  static Decimal parse(const std::string& text);
  bool is_zero() const { return int_digits == "0" && frac_digits.empty(); }
  bool operator==(const Decimal&) const = default;
};
int compare(const Decimal& a, const Decimal& b);

struct NumberBound {
  Decimal value;
  bool exclusive = false;
};

// Integers in [lo, hi]; a missing bound is unbounded. Throws if empty.
ExprPtr integer_range(const std::optional<Decimal>& lo, const std::optional<Decimal>& hi);

// Decimal numbers (optional fraction, no exponent) between the bounds. With an
// exclusive bound the fraction is limited to the digits at which a double
// still tells the number from the bound, so Python's float comparison agrees
// with the grammar; throws (naming `keyword`) when no such limit exists or
// the range is empty.
ExprPtr number_range(const std::optional<NumberBound>& lo, const std::optional<NumberBound>& hi);

}  // namespace serval::grammar
