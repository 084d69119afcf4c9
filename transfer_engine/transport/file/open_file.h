#ifndef MOONCAKE_TRANSFER_ENGINE_TRANSPORT_FILE_OPEN_FILE_H_
#define MOONCAKE_TRANSFER_ENGINE_TRANSPORT_FILE_OPEN_FILE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "transfer_engine/api/status.h"

namespace mooncake::te::file {

/// Direct-I/O alignment of a file: buffers, offsets and lengths must be multiples of these. 1 means no
/// constraint (tmpfs accepts O_DIRECT without reporting or enforcing one).
struct DioAlignment {
  uint32_t memory = 1;
  uint32_t offset = 1;
};

/// statx(STATX_DIOALIGN) of an open file; nullopt-like {0, 0} when the kernel or file system reports none.
DioAlignment QueryDioAlignment(int fd);

/// One file opened for transfers: an O_DIRECT descriptor for whole aligned blocks and a buffered one for the
/// partial blocks at the edges of unaligned requests (the page cache serialises those read-modify-writes, so
/// two requests sharing a block never lose each other's bytes). Both are open until destruction.
///
/// Threading: immutable after Open except Reserve, which is internally locked.
class OpenFile {
 public:
  /// Opens `path` read-write (read-only when `read_only`, or when the file or its file system is), O_DIRECT when
  /// `direct` and the file system allows it. kNotFound when the file does not exist; kInvalidArgument for other
  /// open errors.
  static StatusOr<std::shared_ptr<OpenFile>> Open(const std::string& path, bool direct, bool read_only = false);
  ~OpenFile();
  OpenFile(const OpenFile&) = delete;
  OpenFile& operator=(const OpenFile&) = delete;

  const std::string& path() const { return path_; }
  int direct_fd() const { return direct_fd_; }      ///< == buffered_fd() when O_DIRECT is off
  int buffered_fd() const { return buffered_fd_; }
  bool direct() const { return direct_fd_ != buffered_fd_; }
  bool read_only() const { return read_only_; }
  /// The alignment direct I/O needs on this file ({1, 1} when not direct).
  const DioAlignment& alignment() const { return align_; }

  /// Makes sure the blocks of [0, end) are allocated (fallocate, file size unchanged), once per range, so a
  /// write into them cannot fail half-way with ENOSPC: kMemory ("no space left") before any byte is written.
  /// A file system without fallocate is accepted as is (a write may then still meet ENOSPC).
  Status Reserve(uint64_t end);
  /// Whether the file still backs [0, end): kRemoteRejected when it was removed (no links left) or is
  /// shorter than `end` (truncated).
  Status Check(uint64_t end) const;

  /// One piece of state another layer keeps per open file (GDS: its cuFile handle). The first call runs `make`
  /// (under a lock: exactly once while it succeeds; a null result is not kept and the next call tries again)
  /// and keeps `release`, run on that state by the destructor before the descriptors close.
  void* Attachment(const std::function<void*()>& make, std::function<void(void*)> release);

 private:
  OpenFile() = default;
  std::string path_;
  int direct_fd_ = -1;
  int buffered_fd_ = -1;
  bool read_only_ = false;
  DioAlignment align_;
  std::mutex attach_mu_;
  void* attachment_ = nullptr;
  std::function<void(void*)> release_attachment_;
  std::mutex reserve_mu_;
  uint64_t reserved_ = 0;
  bool reservable_ = true;
};

/// Text for an errno value: "No space left on device (errno 28)".
std::string ErrnoText(int e);

}  // namespace mooncake::te::file

#endif  // MOONCAKE_TRANSFER_ENGINE_TRANSPORT_FILE_OPEN_FILE_H_
