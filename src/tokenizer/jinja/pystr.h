#pragma once
// Python str methods on UTF-8 text, with Python's rules: strip() without
// arguments removes Unicode whitespace, split() without a separator splits on
// runs of whitespace, lower()/upper() use full Unicode case mapping.
#include <optional>
#include <string>
#include <vector>

namespace serval::jinja {

// s.strip(chars) / lstrip / rstrip; chars == nullopt strips whitespace.
std::string py_strip(const std::string& s, const std::optional<std::string>& chars, bool left, bool right);
// s.split(sep, maxsplit) (maxsplit < 0: no limit); sep == nullopt splits on whitespace.
std::vector<std::string> py_split(const std::string& s, const std::optional<std::string>& sep, int64_t maxsplit);
std::vector<std::string> py_rsplit(const std::string& s, const std::optional<std::string>& sep, int64_t maxsplit);
std::vector<std::string> py_splitlines(const std::string& s);
std::string py_replace(const std::string& s, const std::string& old, const std::string& with, int64_t count);
std::string py_lower(const std::string& s);
std::string py_upper(const std::string& s);
std::string py_title(const std::string& s);
std::string py_capitalize(const std::string& s);
int64_t py_count(const std::string& s, const std::string& sub);
// Index in code points of the first (or last) `sub`, or -1.
int64_t py_find(const std::string& s, const std::string& sub, bool reverse);

}  // namespace serval::jinja
