//===- TestUtil.h - temporary files for runtime tests -----------*- C++ -*-===//

#ifndef FASTLLM_RUNTIME_TEST_TESTUTIL_H
#define FASTLLM_RUNTIME_TEST_TESTUTIL_H

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace fastllm::rt::test {

/// A fresh folder per test, removed afterwards, so tests can run in parallel.
class TempDir {
public:
  TempDir() {
    std::string pattern = ::testing::TempDir() + "fastllm-rt-XXXXXX";
    root = mkdtemp(pattern.data());
  }
  ~TempDir() { std::filesystem::remove_all(root); }
  std::string file(const std::string &name) const { return root + "/" + name; }
  const std::string &path() const { return root; }

private:
  std::string root;
};

inline void writeBytes(const std::string &path, const std::string &bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

inline std::string readBytes(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

template <typename T>
void writeTokens(const std::string &path, const std::vector<T> &ids) {
  writeBytes(path, std::string(reinterpret_cast<const char *>(ids.data()),
                               ids.size() * sizeof(T)));
}

} // namespace fastllm::rt::test

#endif // FASTLLM_RUNTIME_TEST_TESTUTIL_H
