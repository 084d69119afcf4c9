#include "transfer_engine/core/managed_memory.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

namespace mooncake::te {

ManagedMemory::ManagedMemory(RegisterFn register_fn, UnregisterFn unregister_fn)
    : register_(std::move(register_fn)), unregister_(std::move(unregister_fn)) {
  int classes = 0;
  for (size_t s = kMinClass; s <= kMaxClass; s <<= 1) ++classes;
  free_lists_.resize(classes);
}

ManagedMemory::~ManagedMemory() {
  for (auto& m : slabs_) {
    munmap(m.base, m.length);
    close(m.fd);
  }
  for (auto& [addr, m] : dedicated_) {
    munmap(m.base, m.length);
    close(m.fd);
  }
}

int ManagedMemory::ClassOf(size_t length) {
  int c = 0;
  for (size_t s = kMinClass; s < length; s <<= 1) ++c;
  return c;
}

StatusOr<ManagedMemory::Mapping> ManagedMemory::Map(size_t length) {
  int fd = memfd_create("mooncake-managed", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return Status(ErrorCode::kMemory, std::string("memfd_create: ") + strerror(errno));
  if (ftruncate(fd, static_cast<off_t>(length)) != 0) {
    Status st(ErrorCode::kMemory, "ftruncate(" + std::to_string(length) + "): " + strerror(errno));
    close(fd);
    return st;
  }
  // Its size is fixed from now on: a process that maps it (a same-host peer) can rely on every page existing.
  (void)fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW);
  void* p = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  // Where shmem transparent huge pages are enabled ("advise"), 2 MiB pages make first touches (here and in
  // peers' mappings) 512x fewer page faults; elsewhere this is a no-op.
  if (p != MAP_FAILED) madvise(p, length, MADV_HUGEPAGE);
  if (p == MAP_FAILED) {
    Status st(ErrorCode::kMemory, "mmap(" + std::to_string(length) + "): " + strerror(errno));
    close(fd);
    return st;
  }
  Status st = register_(p, length, fd);
  if (!st.ok()) {
    munmap(p, length);
    close(fd);
    return st;
  }
  return Mapping{static_cast<char*>(p), length, fd};
}

StatusOr<void*> ManagedMemory::Allocate(size_t length) {
  if (length == 0) return InvalidArgument("cannot allocate 0 bytes");
  std::lock_guard lock(mu_);
  if (length > kMaxClass) {
    size_t rounded = (length + (2 << 20) - 1) & ~static_cast<size_t>((2 << 20) - 1);
    auto m = Map(rounded);
    if (!m.ok()) return m.status();
    dedicated_.emplace(m->base, *m);
    live_.emplace(m->base, -1);
    return static_cast<void*>(m->base);
  }
  int c = ClassOf(length);
  size_t size = kMinClass << c;
  char* p = nullptr;
  if (!free_lists_[c].empty()) {
    p = free_lists_[c].back();
    free_lists_[c].pop_back();
  } else {
    if (slabs_.empty() || slab_used_ + size > slabs_.back().length) {
      auto m = Map(kSlabSize);
      if (!m.ok()) return m.status();
      slabs_.push_back(*m);
      slab_used_ = 0;
    }
    p = slabs_.back().base + slab_used_;
    slab_used_ += size;  // sizes are powers of two <= 256 MiB, so every block stays aligned to its size
  }
  live_.emplace(p, c);
  return static_cast<void*>(p);
}

Status ManagedMemory::Free(void* addr, size_t length) {
  std::lock_guard lock(mu_);
  char* p = static_cast<char*>(addr);
  auto it = live_.find(p);
  if (it == live_.end()) return InvalidArgument("free_managed_buffer: address was not allocated by this engine");
  int c = it->second;
  if (c >= 0 && length != 0 && ClassOf(length) != c) {
    return InvalidArgument("free_managed_buffer: length " + std::to_string(length) +
                           " does not match the allocation's size class");
  }
  live_.erase(it);
  if (c < 0) {
    Mapping m = dedicated_.at(p);
    dedicated_.erase(p);
    unregister_(m.base);
    munmap(m.base, m.length);
    close(m.fd);
    return Status::Ok();
  }
  free_lists_[c].push_back(p);
  return Status::Ok();
}

}  // namespace mooncake::te
