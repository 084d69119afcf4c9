#ifndef MOONCAKE_TRANSFER_ENGINE_TRANSPORT_FILE_TESTING_SCRATCH_H_
#define MOONCAKE_TRANSFER_ENGINE_TRANSPORT_FILE_TESTING_SCRATCH_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace mooncake::te::file::testing {

/// A fresh directory under `root` ("/tmp": ext4 here, enforces O_DIRECT alignment; "/dev/shm": tmpfs, which
/// does not), removed with its files on destruction. Not under $TEST_TMPDIR on purpose: the file system is
/// what the tests are about.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& root);
  ~ScratchDir();
  const std::string& path() const { return path_; }
  /// Creates `name` holding `bytes`; its path.
  std::string WriteFile(const std::string& name, const std::vector<uint8_t>& bytes) const;
  /// The whole content of a file (empty when it cannot be read).
  static std::vector<uint8_t> ReadFile(const std::string& path);

 private:
  std::string path_;
};

/// `n` bytes of a deterministic pattern of `seed` (differs at every offset).
std::vector<uint8_t> Pattern(size_t n, uint64_t seed);

/// The file systems the tests run on: "/tmp" and "/dev/shm" (those that exist).
std::vector<std::string> TestRoots();

}  // namespace mooncake::te::file::testing

#endif  // MOONCAKE_TRANSFER_ENGINE_TRANSPORT_FILE_TESTING_SCRATCH_H_
