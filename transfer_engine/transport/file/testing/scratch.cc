#include "transfer_engine/transport/file/testing/scratch.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>

#include <gtest/gtest.h>

namespace mooncake::te::file::testing {

ScratchDir::ScratchDir(const std::string& root) {
  std::string tmpl = root + "/mc_file_test_XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  const char* p = mkdtemp(buf.data());
  EXPECT_NE(p, nullptr) << "mkdtemp under " << root;
  path_ = p ? p : "";
}

ScratchDir::~ScratchDir() {
  if (path_.empty()) return;
  std::string cmd = "rm -rf '" + path_ + "'";
  int r = system(cmd.c_str());
  (void)r;
}

std::string ScratchDir::WriteFile(const std::string& name, const std::vector<uint8_t>& bytes) const {
  std::string p = path_ + "/" + name;
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  EXPECT_TRUE(out.good()) << p;
  return p;
}

std::vector<uint8_t> ScratchDir::ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::vector<uint8_t> Pattern(size_t n, uint64_t seed) {
  std::vector<uint8_t> v(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    v[i] = static_cast<uint8_t>(x >> 24);
  }
  return v;
}

std::vector<std::string> TestRoots() {
  std::vector<std::string> roots;
  for (const char* r : {"/tmp", "/dev/shm"}) {
    if (access(r, W_OK) == 0) roots.push_back(r);
  }
  return roots;
}

}  // namespace mooncake::te::file::testing
