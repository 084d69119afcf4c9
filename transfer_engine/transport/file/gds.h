#ifndef MOONCAKE_TRANSFER_ENGINE_TRANSPORT_FILE_GDS_H_
#define MOONCAKE_TRANSFER_ENGINE_TRANSPORT_FILE_GDS_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "transfer_engine/api/status.h"
#include "transfer_engine/transport/file/open_file.h"

namespace mooncake::te::file {

/// cuFile (NVIDIA GPUDirect Storage): reads and writes between CUDA device memory and files, resolved at run
/// time from `libcufile.so.0` (or the library `file.cufile_lib` / MC_CUFILE_LIB names) into a function table;
/// compiled against cufile.h (pip `nvidia-cufile-cu12`), never linked. GDS moves the bytes by DMA where
/// nvidia-fs and the file system support it, else cuFile's own compatibility mode stages them.
///
/// Threading: Open and destruction on one thread (the transport's Start/Stop); the rest is thread-safe. Every
/// OpenFile that got a cuFile handle must be destroyed before this object (the transport drops its open files
/// at Stop). The library stays loaded after destruction (a driver library is not safely unloadable). The calling
/// thread must be able to use the device pointer: cuFile uses the thread's current CUDA context, and the
/// platform layer has no call to make one current yet, so on a real GPU the GDS threads rely on cuFile finding
/// the pointer's context (never verified: no GPU here).
class Gds {
 public:
  /// Loads `library` and opens the cuFile driver. kNotImplemented with the reason when either fails (no library,
  /// a symbol missing, cuFileDriverOpen's error: e.g. no nvidia-fs, no GPU).
  static StatusOr<std::unique_ptr<Gds>> Open(const std::string& library);
  ~Gds();
  Gds(const Gds&) = delete;
  Gds& operator=(const Gds&) = delete;

  /// cuFileBufRegister of a device range (an optional speed-up: the transfer works without it).
  Status RegisterBuffer(void* device_ptr, size_t length);
  void DeregisterBuffer(void* device_ptr);
  /// Moves `length` bytes between device memory at `base + base_offset` (`base`: the start of a range given to
  /// RegisterBuffer, or the pointer itself) and `file` at `offset` (a write when `write`); a short count is
  /// continued; an error, or the end of the file, fails with the reason. The file's cuFile handle is made once
  /// per OpenFile (on its O_DIRECT descriptor, or on one opened for it when the file was opened without
  /// O_DIRECT: GDS needs it) and released with the OpenFile.
  Status Transfer(OpenFile& file, bool write, void* base, size_t base_offset, size_t length, uint64_t offset);
  /// "cuFile via <library>": for logs and Stats.
  const std::string& description() const { return description_; }

 private:
  struct Api;
  Gds() = default;
  void* library_ = nullptr;
  std::unique_ptr<Api> api_;
  std::string description_;
};

}  // namespace mooncake::te::file

#endif  // MOONCAKE_TRANSFER_ENGINE_TRANSPORT_FILE_GDS_H_
