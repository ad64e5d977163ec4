// GemmSearchCache: the file --gemm-search-cache names (format in the header).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "backend/cuda/cuda_gemm_search_cache.h"
#include "core/error.h"

namespace serval::cuda {

namespace {

constexpr const char* kHeaderPrefix = "serval gemm search cache v1: ";

void write_config(std::ostream& os, const LtConfig& c) {
  os << c.id << ' ' << c.tile << ' ' << c.stages << ' ' << c.split_k << ' ' << c.reduction << ' ' << c.swizzle << ' '
     << c.custom << ' ' << c.cluster << ' ' << c.inner;
}

bool read_config(std::istream& is, LtConfig& c) {
  return bool(is >> c.id >> c.tile >> c.stages >> c.split_k >> c.reduction >> c.swizzle >> c.custom >> c.cluster >>
              c.inner);
}

}  // namespace

GemmSearchCache::GemmSearchCache(std::string path, std::string device)
    : path_(std::move(path)), device_(std::move(device)) {
  // A directory, or a file in a missing one, is an error now, at start-up,
  // not at the end of the first search.
  const std::filesystem::path file(path_), dir = file.parent_path();
  SERVAL_CHECK(!std::filesystem::is_directory(file), "--gemm-search-cache ", path_, " is a directory, not a file");
  SERVAL_CHECK(dir.empty() || std::filesystem::is_directory(dir), "--gemm-search-cache ", path_, ": directory ",
               dir.string(), " does not exist");
  std::ifstream in(path_);
  if (!in) return;  // no file yet: the first put() writes it
  std::string line;
  if (!std::getline(in, line)) return;
  if (line != header()) {
    SERVAL_CHECK(line.rfind(kHeaderPrefix, 0) == 0, "--gemm-search-cache ", path_,
                 ": not a gemm search cache (its first line should start \"", kHeaderPrefix, "\")");
    set_aside_ = true;
    return;
  }
  for (int n = 2; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    std::istringstream ls(line);
    Key key{};
    std::string eq, rest;
    bool ok = true;
    for (int64_t& v : key) ok = ok && bool(ls >> v);
    LtConfig c;
    ok = ok && bool(ls >> eq) && eq == "=" && read_config(ls, c) && !(ls >> rest);
    SERVAL_CHECK(ok, "--gemm-search-cache ", path_, ", line ", n, ": expected ", kKeyFields,
                 " integers, \"=\" and 9 integers, got \"", line, "\"");
    entries_[key] = c;
  }
}

std::string GemmSearchCache::header() const { return kHeaderPrefix + device_; }

std::optional<LtConfig> GemmSearchCache::find(const Key& key) const {
  const auto it = entries_.find(key);
  if (it == entries_.end()) return std::nullopt;
  return it->second;
}

void GemmSearchCache::put(const Key& key, const LtConfig& config) {
  entries_[key] = config;
  const std::string tmp = path_ + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    SERVAL_CHECK(bool(out), "--gemm-search-cache ", path_, ": cannot write ", tmp);
    out << header() << '\n';
    for (const auto& [k, c] : entries_) {
      for (int64_t v : k) out << v << ' ';
      out << "= ";
      write_config(out, c);
      out << '\n';
    }
    SERVAL_CHECK(bool(out.flush()), "--gemm-search-cache ", path_, ": cannot write ", tmp);
  }
  SERVAL_CHECK(std::rename(tmp.c_str(), path_.c_str()) == 0, "--gemm-search-cache ", path_, ": cannot replace it with ",
               tmp);
  set_aside_ = false;
}

}  // namespace serval::cuda
