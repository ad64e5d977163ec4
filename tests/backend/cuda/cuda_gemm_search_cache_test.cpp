// GemmSearchCache, the file of --gemm-search-cache: what put() writes a later
// instance reads back; another device's file is set aside and then replaced;
// a file that is not one, or a broken line, is an error naming the file and
// line, and so is a directory or a file in a missing one. Host code only: runs wherever the CUDA backend is built, GPU or not.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "core/error.h"
#include "../../model/test_models.h"
#ifdef SERVAL_WITH_CUDA
#include "backend/cuda/cuda_gemm_search_cache.h"
#endif

namespace serval::testing {
namespace {

#ifdef SERVAL_WITH_CUDA
using cuda::GemmSearchCache;
using cuda::LtConfig;

const GemmSearchCache::Key kQkv = {12288, 64, 4096, 0, 1, 0, 0, 0, 4096, 0};
const GemmSearchCache::Key kLmHead = {32000, 256, 4096, 1, 1, 0, 0, 0, 4096, 0};
const LtConfig kA = {66, 13, 35, 1, 0, 0, 5, 3, 0};
const LtConfig kB = {66, 20, 35, 2, 2, 1, 1, 2, 0};

std::string first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

TEST(GemmSearchCache, WhatPutWritesALaterInstanceReads) {
  ScratchDir dir;
  const std::string path = dir.file("gemm.txt");
  {
    GemmSearchCache cache(path, "H200, 132 SMs, cuBLASLt 130000");
    EXPECT_EQ(cache.size(), 0u);
    EXPECT_FALSE(std::filesystem::exists(path));  // nothing written before the first result
    cache.put(kQkv, kA);
    cache.put(kLmHead, kB);
    cache.put(kQkv, kB);  // a key's later result replaces its earlier one
  }
  GemmSearchCache again(path, "H200, 132 SMs, cuBLASLt 130000");
  EXPECT_EQ(again.size(), 2u);
  EXPECT_FALSE(again.set_aside());
  ASSERT_TRUE(again.find(kQkv).has_value());
  EXPECT_EQ(*again.find(kQkv), kB);
  EXPECT_EQ(*again.find(kLmHead), kB);
  GemmSearchCache::Key other = kQkv;
  other[9] = 1;  // the same shape in f32 activations is another product
  EXPECT_FALSE(again.find(other).has_value());
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST(GemmSearchCache, AnotherDevicesFileIsSetAsideThenReplaced) {
  ScratchDir dir;
  const std::string path = dir.file("gemm.txt");
  GemmSearchCache(path, "H100, 132 SMs, cuBLASLt 130000").put(kQkv, kA);
  GemmSearchCache cache(path, "H200, 132 SMs, cuBLASLt 130000");
  EXPECT_TRUE(cache.set_aside());
  EXPECT_EQ(cache.size(), 0u);
  EXPECT_FALSE(cache.find(kQkv).has_value());
  cache.put(kLmHead, kB);
  EXPECT_FALSE(cache.set_aside());
  EXPECT_NE(first_line(path).find("H200"), std::string::npos) << first_line(path);
  GemmSearchCache again(path, "H200, 132 SMs, cuBLASLt 130000");
  EXPECT_EQ(again.size(), 1u);
  EXPECT_FALSE(again.find(kQkv).has_value());
}

TEST(GemmSearchCache, ABrokenFileIsAnErrorNamingFileAndLine) {
  ScratchDir dir;
  const std::string path = dir.file("gemm.txt");
  GemmSearchCache(path, "dev").put(kQkv, kA);
  {
    std::ofstream out(path, std::ios::app);
    out << "12288 64 4096 0 1 0 0 0 4096 0 = 66 13 35\n";  // a config cut short
  }
  try {
    GemmSearchCache cache(path, "dev");
    FAIL() << "a truncated line was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("line 3"), std::string::npos) << e.what();
  }
  {
    std::ofstream out(path, std::ios::trunc);
    out << "{\"not\": \"a cache\"}\n";
  }
  EXPECT_THROW(GemmSearchCache(path, "dev"), Error);
}

TEST(GemmSearchCache, ADirectoryOrAMissingOneIsAnErrorAtOnce) {
  ScratchDir dir;
  try {
    GemmSearchCache cache(dir.file("no-such-dir/gemm.txt"), "dev");
    FAIL() << "a file in a missing directory was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not exist"), std::string::npos) << e.what();
  }
  std::filesystem::create_directories(dir.file("a-dir"));
  try {
    GemmSearchCache cache(dir.file("a-dir"), "dev");
    FAIL() << "a directory was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is a directory"), std::string::npos) << e.what();
  }
}
#endif

}  // namespace
}  // namespace serval::testing
