#include "grammar/json_number_grammar.h"

#include <algorithm>

#include "core/error.h"

namespace serval::grammar {

namespace {

// Digit strings of natural numbers: canonical (no leading zeros), "0" for zero.
std::string nat_inc(std::string s) {
  for (size_t i = s.size(); i-- > 0;) {
    if (s[i] != '9') {
      ++s[i];
      return s;
    }
    s[i] = '0';
  }
  return "1" + s;
}

std::string nat_dec(std::string s) {  // s > 0
  for (size_t i = s.size(); i-- > 0;) {
    if (s[i] != '0') {
      --s[i];
      break;
    }
    s[i] = '9';
  }
  size_t nz = s.find_first_not_of('0');
  return nz == std::string::npos ? "0" : s.substr(nz);
}

int nat_compare(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return a.size() < b.size() ? -1 : 1;
  return a < b ? -1 : a > b ? 1 : 0;
}

ExprPtr digit() { return cls({{'0', '9'}}); }
ExprPtr digits(uint32_t min, uint32_t max) { return repeat(digit(), min, max); }
ExprPtr digit_class(char lo, char hi) { return cls({{uint32_t(lo), uint32_t(hi)}}); }

// Same-length digit strings in [lo, hi].
ExprPtr fixed_range(const std::string& lo, const std::string& hi) {
  size_t n = lo.size();
  if (n == 0) return empty();
  if (lo == hi) return lit(lo);
  if (lo[0] == hi[0]) return seq({lit(lo.substr(0, 1)), fixed_range(lo.substr(1), hi.substr(1))});
  std::string zeros(n - 1, '0'), nines(n - 1, '9');
  bool lo_full = lo.substr(1) == zeros, hi_full = hi.substr(1) == nines;
  std::vector<ExprPtr> alts;
  char mid_lo = lo_full ? lo[0] : char(lo[0] + 1);
  char mid_hi = hi_full ? hi[0] : char(hi[0] - 1);
  if (!lo_full) alts.push_back(seq({lit(lo.substr(0, 1)), fixed_range(lo.substr(1), nines)}));
  if (mid_lo <= mid_hi) alts.push_back(seq({digit_class(mid_lo, mid_hi), digits(uint32_t(n - 1), uint32_t(n - 1))}));
  if (!hi_full) alts.push_back(seq({lit(hi.substr(0, 1)), fixed_range(zeros, hi.substr(1))}));
  return alt(std::move(alts));
}

// Naturals in [a, b]; b empty = unbounded. a <= b.
ExprPtr nat_range(const std::string& a, const std::string& b) {
  std::vector<ExprPtr> alts;
  std::string lo = a;
  if (lo == "0") {
    alts.push_back(lit("0"));
    if (b == "0") return alts[0];
    lo = "1";
  }
  size_t max_len = b.empty() ? lo.size() : b.size();
  for (size_t len = lo.size(); len <= max_len; ++len) {
    std::string from = len == lo.size() ? lo : "1" + std::string(len - 1, '0');
    std::string to = (!b.empty() && len == b.size()) ? b : std::string(len, '9');
    alts.push_back(fixed_range(from, to));
  }
  if (b.empty()) alts.push_back(seq({digit_class('1', '9'), digits(uint32_t(lo.size()), kUnbounded)}));
  return alt(std::move(alts));
}

// Integer part of a decimal, rounded up or down.
struct Int {
  bool negative = false;
  std::string mag;
};

Int ceil_int(const Decimal& d) {
  if (d.frac_digits.empty() || d.negative) return {d.negative && d.int_digits != "0", d.int_digits};
  return {false, nat_inc(d.int_digits)};
}

Int floor_int(const Decimal& d) {
  if (d.frac_digits.empty() || !d.negative) return {d.negative && d.int_digits != "0", d.int_digits};
  return {true, nat_inc(d.int_digits)};
}

// --- fractions: 0.F against bounds 0.g / 0.h, F at most `cap` digits ---

uint32_t less1(uint32_t cap) { return cap == kUnbounded ? kUnbounded : cap - 1; }

ExprPtr any_frac(uint32_t cap) { return cap == 0 ? empty() : opt(seq({lit("."), digits(1, cap)})); }

ExprPtr alt_of(std::vector<ExprPtr> alts) {
  std::erase(alts, nullptr);
  return alts.empty() ? nullptr : alt(std::move(alts));
}

// Nonempty F with 0.F >= 0.g (g nonempty).
ExprPtr ge_digits(const std::string& g, uint32_t cap) {
  if (cap == 0) return nullptr;
  std::vector<ExprPtr> alts;
  if (g[0] < '9') alts.push_back(seq({digit_class(char(g[0] + 1), '9'), digits(0, less1(cap))}));
  std::string rest = g.substr(1);
  ExprPtr tail = rest.empty() ? digits(0, less1(cap)) : ge_digits(rest, less1(cap));
  if (tail) alts.push_back(seq({lit(g.substr(0, 1)), tail}));
  return alt_of(std::move(alts));
}

// Nonempty F with 0.F <= 0.h.
ExprPtr le_digits(const std::string& h, uint32_t cap) {
  if (cap == 0) return nullptr;
  if (h.empty()) return repeat(lit("0"), 1, cap);
  std::vector<ExprPtr> alts;
  if (h[0] > '0') alts.push_back(seq({digit_class('0', char(h[0] - 1)), digits(0, less1(cap))}));
  std::string rest = h.substr(1);
  ExprPtr tail = rest.empty() ? repeat(lit("0"), 0, less1(cap)) : nullptr;
  if (!rest.empty()) {
    ExprPtr more = le_digits(rest, less1(cap));
    tail = more ? opt(more) : empty();
  }
  alts.push_back(seq({lit(h.substr(0, 1)), tail}));
  return alt_of(std::move(alts));
}

// Optional fraction with 0.F >= 0.g.
ExprPtr ge_frac(const std::string& g, uint32_t cap) {
  if (g.empty()) return any_frac(cap);
  ExprPtr d = ge_digits(g, cap);
  return d ? seq({lit("."), d}) : nullptr;
}

// Optional fraction with 0.F <= 0.h.
ExprPtr le_frac(const std::string& h, uint32_t cap) {
  ExprPtr d = le_digits(h, cap);
  return d ? opt(seq({lit("."), d})) : empty();
}

// Nonempty F with 0.g <= 0.F <= 0.h (g nonempty, g <= h).
ExprPtr between_digits(const std::string& g, const std::string& h, uint32_t cap) {
  if (cap == 0) return nullptr;
  std::string g1 = g.substr(1), h1 = h.empty() ? "" : h.substr(1);
  char h0 = h.empty() ? '0' : h[0];
  auto le_rest = [&](const std::string& r) -> ExprPtr {
    if (r.empty()) return repeat(lit("0"), 0, less1(cap));
    ExprPtr more = le_digits(r, less1(cap));
    return more ? opt(more) : empty();
  };
  if (g[0] == h0) {
    ExprPtr tail = g1.empty() ? le_rest(h1) : between_digits(g1, h1, less1(cap));
    return tail ? seq({lit(g.substr(0, 1)), tail}) : nullptr;
  }
  std::vector<ExprPtr> alts;
  ExprPtr ge_tail = g1.empty() ? digits(0, less1(cap)) : ge_digits(g1, less1(cap));
  if (ge_tail) alts.push_back(seq({lit(g.substr(0, 1)), ge_tail}));
  if (g[0] + 1 <= h0 - 1) alts.push_back(seq({digit_class(char(g[0] + 1), char(h0 - 1)), digits(0, less1(cap))}));
  alts.push_back(seq({lit(std::string(1, h0)), le_rest(h1)}));
  return alt_of(std::move(alts));
}

ExprPtr between_frac(const std::string& g, const std::string& h, uint32_t cap) {
  if (g.empty()) return le_frac(h, cap);
  ExprPtr d = between_digits(g, h, cap);
  return d ? seq({lit("."), d}) : nullptr;
}

// Magnitudes in [a, b] (both inclusive, b absent = unbounded), as "I(.F)?".
ExprPtr magnitude_range(const Decimal& a, const std::optional<Decimal>& b, uint32_t cap) {
  if (b && compare(a, *b) > 0) return nullptr;
  std::vector<ExprPtr> alts;
  if (b && a.int_digits == b->int_digits) {
    ExprPtr f = between_frac(a.frac_digits, b->frac_digits, cap);
    return f ? seq({lit(a.int_digits), f}) : nullptr;
  }
  if (ExprPtr f = ge_frac(a.frac_digits, cap)) alts.push_back(seq({lit(a.int_digits), f}));
  std::string next = nat_inc(a.int_digits);
  if (!b) {
    alts.push_back(seq({nat_range(next, ""), any_frac(cap)}));
  } else {
    if (nat_compare(next, b->int_digits) < 0) alts.push_back(seq({nat_range(next, nat_dec(b->int_digits)), any_frac(cap)}));
    alts.push_back(seq({lit(b->int_digits), le_frac(b->frac_digits, cap)}));
  }
  return alt_of(std::move(alts));
}

// The decimal rounded to `cap` fraction digits, up or down (magnitudes).
Decimal round_mag(Decimal d, uint32_t cap, bool up) {
  d.negative = false;
  if (d.frac_digits.size() <= cap) return d;
  d.frac_digits.resize(cap);
  if (up) {
    // Add one unit of the last kept digit.
    std::string all = d.int_digits + d.frac_digits;
    all = nat_inc(all);
    size_t int_len = all.size() - cap;
    d.int_digits = all.substr(0, int_len);
    d.frac_digits = all.substr(int_len);
  }
  while (!d.frac_digits.empty() && d.frac_digits.back() == '0') d.frac_digits.pop_back();
  if (d.int_digits.empty()) d.int_digits = "0";
  return d;
}

// One unit of the cap-th fraction digit added to (or taken from) a magnitude
// with at most cap fraction digits; nullopt below zero.
std::optional<Decimal> step_mag(const Decimal& d, uint32_t cap, bool up) {
  std::string frac = d.frac_digits + std::string(cap - d.frac_digits.size(), '0');
  std::string all = d.int_digits + frac;
  if (!up && all.find_first_not_of('0') == std::string::npos) return std::nullopt;
  all = up ? nat_inc(all) : nat_dec(all);
  if (all.size() <= cap) all = std::string(cap + 1 - all.size(), '0') + all;
  Decimal out;
  out.int_digits = all.substr(0, all.size() - cap);
  size_t nz = out.int_digits.find_first_not_of('0');
  out.int_digits = nz == std::string::npos ? "0" : out.int_digits.substr(nz);
  out.frac_digits = all.substr(all.size() - cap);
  while (!out.frac_digits.empty() && out.frac_digits.back() == '0') out.frac_digits.pop_back();
  return out;
}

}  // namespace

Decimal Decimal::parse(const std::string& text) {
  Decimal d;
  size_t i = 0;
  if (i < text.size() && text[i] == '-') d.negative = true, ++i;
  std::string mant;
  long point = -1;
  for (; i < text.size() && text[i] != 'e' && text[i] != 'E'; ++i) {
    if (text[i] == '.') {
      point = long(mant.size());
    } else {
      SERVAL_CHECK(text[i] >= '0' && text[i] <= '9', "not a decimal number: ", text);
      mant += text[i];
    }
  }
  if (point < 0) point = long(mant.size());
  if (i < text.size()) point += std::stol(text.substr(i + 1));
  if (point <= 0) {
    mant = std::string(size_t(-point), '0') + mant;
    point = 0;
  }
  if (size_t(point) > mant.size()) mant += std::string(size_t(point) - mant.size(), '0');
  d.int_digits = mant.substr(0, size_t(point));
  d.frac_digits = mant.substr(size_t(point));
  size_t nz = d.int_digits.find_first_not_of('0');
  d.int_digits = nz == std::string::npos ? "0" : d.int_digits.substr(nz);
  while (!d.frac_digits.empty() && d.frac_digits.back() == '0') d.frac_digits.pop_back();
  if (d.is_zero()) d.negative = false;
  return d;
}

int compare(const Decimal& a, const Decimal& b) {
  if (a.negative != b.negative) return a.negative ? -1 : 1;
  int sign = a.negative ? -1 : 1;
  int c = nat_compare(a.int_digits, b.int_digits);
  if (c == 0) {
    size_t n = std::max(a.frac_digits.size(), b.frac_digits.size());
    std::string fa = a.frac_digits + std::string(n - a.frac_digits.size(), '0');
    std::string fb = b.frac_digits + std::string(n - b.frac_digits.size(), '0');
    c = fa < fb ? -1 : fa > fb ? 1 : 0;
  }
  return sign * c;
}

ExprPtr integer_range(const std::optional<Decimal>& lo, const std::optional<Decimal>& hi) {
  std::optional<Int> l, h;
  if (lo) l = ceil_int(*lo);
  if (hi) h = floor_int(*hi);
  std::vector<ExprPtr> alts;
  // Negative integers -m, m in [m_lo, m_hi].
  if (!l || l->negative) {
    std::string m_lo = (h && h->negative) ? h->mag : "1";
    std::string m_hi = l ? l->mag : "";
    if (m_hi.empty() || nat_compare(m_lo, m_hi) <= 0) alts.push_back(seq({lit("-"), nat_range(m_lo, m_hi)}));
  }
  // Non-negative integers in [max(lo, 0), hi].
  if (!h || !h->negative) {
    std::string n_lo = (l && !l->negative) ? l->mag : "0";
    std::string n_hi = h ? h->mag : "";
    if (n_hi.empty() || nat_compare(n_lo, n_hi) <= 0) alts.push_back(nat_range(n_lo, n_hi));
  }
  SERVAL_CHECK(!alts.empty(), "no integer lies between the bounds");
  return alt(std::move(alts));
}

ExprPtr number_range(const std::optional<NumberBound>& lo, const std::optional<NumberBound>& hi) {
  // Fraction digits: unbounded with inclusive bounds (rounding to a double
  // is monotonic, so a decimal within them stays within); with an exclusive
  // bound, few enough that a double can still tell a number from the bound.
  uint32_t cap = kUnbounded;
  for (const auto* b : {&lo, &hi}) {
    if (!*b || !(*b)->exclusive) continue;
    long room = 14 - long((*b)->value.int_digits.size());
    SERVAL_CHECK(room >= 0, "exclusive bound ", (*b)->value.int_digits, " is too large to keep exact");
    cap = std::min<uint32_t>(cap, uint32_t(std::min<long>(room, 6)));
  }
  // Inclusive magnitude bounds on each side of zero.
  auto lower_mag = [&](const NumberBound& b, bool up) -> std::optional<Decimal> {
    // For a lower bound of magnitudes (`up`): the smallest allowed magnitude.
    if (cap == kUnbounded) return Decimal{false, b.value.int_digits, b.value.frac_digits};
    Decimal r = round_mag(b.value, cap, up);
    bool rounded = compare(r, Decimal{false, b.value.int_digits, b.value.frac_digits}) != 0;
    if (b.exclusive && !rounded) return step_mag(r, cap, up);
    return r;
  };
  std::vector<ExprPtr> alts;
  auto smallest_positive = [&] {
    Decimal d;
    uint32_t k = cap == kUnbounded ? 6 : cap;  // unbounded: magnitudes below 1e-6 are left out
    if (k == 0) d.int_digits = "1";
    else d.frac_digits = std::string(k - 1, '0') + "1";
    return d;
  };
  // Negative numbers: magnitude u in [u_lo, u_hi], u > 0.
  if (!lo || lo->value.negative) {
    std::optional<Decimal> u_hi;
    if (lo) u_hi = lower_mag(*lo, false);
    Decimal u_lo = smallest_positive();
    if (hi && hi->value.negative) {
      auto m = lower_mag(*hi, true);
      if (m && compare(*m, u_lo) > 0) u_lo = *m;
    }
    if (u_hi) {
      if (ExprPtr e = magnitude_range(u_lo, u_hi, cap)) alts.push_back(seq({lit("-"), e}));
    } else {
      alts.push_back(seq({lit("-"), magnitude_range(u_lo, std::nullopt, cap)}));
    }
  }
  // Zero and positive numbers: v in [v_lo, v_hi].
  if (!hi || !hi->value.negative) {
    Decimal v_lo;  // zero
    if (lo && !lo->value.negative) {
      auto m = lower_mag(*lo, true);
      if (m) v_lo = *m;
    }
    std::optional<Decimal> v_hi;
    bool empty_range = false;
    if (hi) {
      v_hi = lower_mag(*hi, false);
      empty_range = !v_hi.has_value();
    }
    if (!empty_range)
      if (ExprPtr e = magnitude_range(v_lo, v_hi, cap)) alts.push_back(e);
  }
  SERVAL_CHECK(!alts.empty(), "no number lies between the bounds");
  return alt(std::move(alts));
}

}  // namespace serval::grammar
