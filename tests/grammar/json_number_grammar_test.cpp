// Number bounds by digit-range construction, checked against plain
// arithmetic over every integer and every short decimal of a window.
#include "grammar/json_number_grammar.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <optional>

#include "core/error.h"
#include "grammar/compiled_grammar.h"
#include "grammar_test_util.h"

namespace serval::grammar {
namespace {

using testing::matches;

std::shared_ptr<const CompiledGrammar> compile_expr(ExprPtr e) {
  Grammar g;
  g.set("root", std::move(e));
  return CompiledGrammar::compile(g);
}

TEST(JsonSchemaNumbers, DecimalParsing) {
  EXPECT_EQ(Decimal::parse("12"), (Decimal{false, "12", ""}));
  EXPECT_EQ(Decimal::parse("-0.50"), (Decimal{true, "0", "5"}));
  EXPECT_EQ(Decimal::parse("1e-07"), (Decimal{false, "0", "0000001"}));
  EXPECT_EQ(Decimal::parse("2.5E+3"), (Decimal{false, "2500", ""}));
  EXPECT_EQ(Decimal::parse("-0"), (Decimal{false, "0", ""}));
  EXPECT_LT(compare(Decimal::parse("-3"), Decimal::parse("-2.5")), 0);
  EXPECT_GT(compare(Decimal::parse("0.25"), Decimal::parse("0.2")), 0);
}

TEST(JsonSchemaNumbers, IntegerRangesAreExact) {
  const std::optional<long> bounds[] = {std::nullopt, -1000, -101, -100, -99, -10, -9, -1, 0, 1, 9, 10, 99, 100, 101, 999, 1000};
  for (const auto& lo : bounds) {
    for (const auto& hi : bounds) {
      if (lo && hi && *lo > *hi) continue;
      std::optional<Decimal> l, h;
      if (lo) l = Decimal::parse(std::to_string(*lo));
      if (hi) h = Decimal::parse(std::to_string(*hi));
      auto g = compile_expr(integer_range(l, h));
      for (long n = -1200; n <= 1200; ++n) {
        bool want = (!lo || n >= *lo) && (!hi || n <= *hi);
        ASSERT_EQ(matches(g, std::to_string(n)), want) << n << " in [" << (lo ? *lo : -99999) << ", " << (hi ? *hi : 99999) << "]";
      }
      for (const char* bad : {"01", "-0", "+1", "00", "1.0", ""}) ASSERT_FALSE(matches(g, bad)) << bad;
    }
  }
}

TEST(JsonSchemaNumbers, IntegerBoundsMayBeFractionalOrHuge) {
  auto g = compile_expr(integer_range(Decimal::parse("-2.5"), Decimal::parse("3.7")));
  EXPECT_TRUE(matches(g, "-2"));
  EXPECT_FALSE(matches(g, "-3"));
  EXPECT_TRUE(matches(g, "3"));
  EXPECT_FALSE(matches(g, "4"));
  auto big = compile_expr(integer_range(Decimal::parse("123456789012345678901234567890"), std::nullopt));
  EXPECT_TRUE(matches(big, "123456789012345678901234567890"));
  EXPECT_TRUE(matches(big, "1000000000000000000000000000000"));
  EXPECT_FALSE(matches(big, "123456789012345678901234567889"));
  EXPECT_THROW(integer_range(Decimal::parse("1.2"), Decimal::parse("1.8")), Error);
}

// Decimals with up to three fraction digits, as thousandths.
std::string decimal_text(long thousandths, int frac_digits) {
  long mag = thousandths < 0 ? -thousandths : thousandths;
  char buf[64];
  if (frac_digits == 0) {
    if (mag % 1000) return "";
    std::snprintf(buf, sizeof buf, "%s%ld", thousandths < 0 ? "-" : "", mag / 1000);
  } else {
    long div = frac_digits == 1 ? 100 : frac_digits == 2 ? 10 : 1;
    if (mag % div) return "";
    std::snprintf(buf, sizeof buf, "%s%ld.%0*ld", thousandths < 0 ? "-" : "", mag / 1000, frac_digits, (mag % 1000) / div);
  }
  return buf;
}

TEST(JsonSchemaNumbers, DecimalRangesAreExact) {
  struct B {
    const char* text;
    long thousandths;
  };
  const std::optional<B> values[] = {std::nullopt, B{"-2.5", -2500}, B{"-1", -1000}, B{"-0.05", -50}, B{"0", 0},
                                     B{"0.1", 100},  B{"0.25", 250},  B{"1", 1000},     B{"1.999", 1999}, B{"3", 3000}};
  for (const auto& lo : values) {
    for (const auto& hi : values) {
      for (int excl = 0; excl < 4; ++excl) {
        bool lo_ex = excl & 1, hi_ex = excl & 2;
        if ((!lo && lo_ex) || (!hi && hi_ex)) continue;
        if (lo && hi && (lo->thousandths > hi->thousandths ||
                         (lo->thousandths == hi->thousandths && (lo_ex || hi_ex))))
          continue;
        std::optional<NumberBound> l, h;
        if (lo) l = NumberBound{Decimal::parse(lo->text), lo_ex};
        if (hi) h = NumberBound{Decimal::parse(hi->text), hi_ex};
        auto g = compile_expr(number_range(l, h));
        for (long v = -3500; v <= 3500; v += 1) {
          bool want = (!lo || (lo_ex ? v > lo->thousandths : v >= lo->thousandths)) &&
                      (!hi || (hi_ex ? v < hi->thousandths : v <= hi->thousandths));
          for (int fd = 0; fd <= 3; ++fd) {
            std::string text = decimal_text(v, fd);
            if (text.empty() || text == "-0" || text.rfind("-0.", 0) == 0 && v == 0) continue;
            if (!want) {
              ASSERT_FALSE(matches(g, text)) << text << " lo " << (lo ? lo->text : "-") << (lo_ex ? " (excl)" : "")
                                             << " hi " << (hi ? hi->text : "-") << (hi_ex ? " (excl)" : "");
            } else if (v != 0 || fd == 0) {
              ASSERT_TRUE(matches(g, text)) << text << " lo " << (lo ? lo->text : "-") << (lo_ex ? " (excl)" : "")
                                            << " hi " << (hi ? hi->text : "-") << (hi_ex ? " (excl)" : "");
            }
          }
        }
      }
    }
  }
}

TEST(JsonSchemaNumbers, ExclusiveBoundsLimitFractionDigits) {
  // 0.99999999999999999 rounds to the double 1.0, which exclusiveMaximum 1
  // excludes: such digits must not be generated.
  auto g = compile_expr(number_range(std::nullopt, NumberBound{Decimal::parse("1"), true}));
  EXPECT_TRUE(matches(g, "0.999999"));
  EXPECT_FALSE(matches(g, "0.99999999999999999"));
  EXPECT_FALSE(matches(g, "1"));
  // Inclusive bounds keep any number of digits.
  auto incl = compile_expr(number_range(std::nullopt, NumberBound{Decimal::parse("1"), false}));
  EXPECT_TRUE(matches(incl, "0.99999999999999999"));
  EXPECT_TRUE(matches(incl, "1.000"));
  EXPECT_FALSE(matches(incl, "1.0000000001"));
  EXPECT_THROW(number_range(NumberBound{Decimal::parse("1e20"), true}, std::nullopt), Error);
}

}  // namespace
}  // namespace serval::grammar
