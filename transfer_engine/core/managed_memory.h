#ifndef MOONCAKE_TRANSFER_ENGINE_CORE_MANAGED_MEMORY_H_
#define MOONCAKE_TRANSFER_ENGINE_CORE_MANAGED_MEMORY_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "transfer_engine/api/status.h"

namespace mooncake::te {

/// Allocator behind allocate_managed_buffer. Memory comes from memfd-backed shared mappings (so same-host
/// peers can map it later), registered through the callbacks when a mapping is created and unregistered when
/// a dedicated mapping is freed. Size classes are powers of two from 8 KiB to 256 MiB carved from 1 GiB
/// slabs (pages are committed on first touch); freed blocks are reused by their class. Thread-safe.
class ManagedMemory {
 public:
  using RegisterFn = std::function<Status(void* addr, size_t length, int memfd)>;
  using UnregisterFn = std::function<void(void* addr)>;

  ManagedMemory(RegisterFn register_fn, UnregisterFn unregister_fn);
  /// Unmaps everything; the owner must have unregistered (or be done with) the memory.
  ~ManagedMemory();

  StatusOr<void*> Allocate(size_t length);
  /// kInvalidArgument when `addr` is not a live allocation of this size class.
  Status Free(void* addr, size_t length);

  static constexpr size_t kMinClass = 8 << 10;
  static constexpr size_t kMaxClass = 256 << 20;
  static constexpr size_t kSlabSize = 1ULL << 30;

 private:
  struct Mapping {
    char* base;
    size_t length;
    int fd;
  };
  StatusOr<Mapping> Map(size_t length);
  static int ClassOf(size_t length);

  RegisterFn register_;
  UnregisterFn unregister_;
  std::mutex mu_;
  std::vector<Mapping> slabs_;
  size_t slab_used_ = 0;  // bump offset in slabs_.back()
  std::vector<std::vector<char*>> free_lists_;
  std::unordered_map<char*, int> live_;  // address -> class, or -1 for a dedicated mapping
  std::unordered_map<char*, Mapping> dedicated_;
};

}  // namespace mooncake::te

#endif  // MOONCAKE_TRANSFER_ENGINE_CORE_MANAGED_MEMORY_H_
