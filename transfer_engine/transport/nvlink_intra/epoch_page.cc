#include "transfer_engine/transport/nvlink_intra/epoch_page.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>

#include "transfer_engine/common/format.h"

namespace mooncake::te::nvlink_intra {
namespace {


// Opens the peer's fd `fd` through /proc (read access to the peer: same user or root), read-only.
StatusOr<int> OpenPeerFd(int64_t pid, int64_t fd) {
  std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
  int local = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (local < 0) {
    return Status(errno == ENOENT ? ErrorCode::kPeerUnreachable : ErrorCode::kRemoteRejected,
                  "nvlink_intra: cannot open the epoch page " + path + ": " + strerror(errno));
  }
  // Only a memfd whose size is sealed at a page or more: a peer cannot shrink it under our mapping (SIGBUS).
  struct stat st;
  int seals = fcntl(local, F_GET_SEALS);
  if (seals < 0 || !(seals & F_SEAL_SHRINK) || fstat(local, &st) != 0 || st.st_size < static_cast<off_t>(kEpochTableBytes)) {
    close(local);
    return Status(ErrorCode::kRemoteRejected, "nvlink_intra: " + path + " is not a sealed epoch table");
  }
  return local;
}

}  // namespace

LocalEpochs::LocalEpochs() {
  int fd = memfd_create("mc-nvlink-intra-epochs", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  void* p = MAP_FAILED;
  if (fd >= 0 && ftruncate(fd, kEpochTableBytes) == 0 &&
      fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == 0) {
    p = mmap(nullptr, kEpochTableBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  if (p == MAP_FAILED) {
    if (fd >= 0) close(fd);
    private_.reset(new std::atomic<uint64_t>[kEpochSlots]);
    for (size_t i = 0; i < kEpochSlots; ++i) private_[i].store(0);
    values_ = private_.get();
    return;
  }
  fd_ = fd;
  values_ = static_cast<std::atomic<uint64_t>*>(p);  // a zero-filled memfd: every counter starts at 0
}

LocalEpochs::~LocalEpochs() {
  if (fd_ < 0) return;
  munmap(static_cast<void*>(values_), kEpochTableBytes);
  close(fd_);
}

StatusOr<std::pair<uint32_t, uint64_t>> LocalEpochs::Assign() {
  std::lock_guard lock(mu_);
  uint32_t slot;
  if (!free_.empty()) {
    slot = free_.back();
    free_.pop_back();
  } else if (next_ < kEpochSlots) {
    slot = next_++;
  } else {
    return Status(ErrorCode::kTooManyRequests, "nvlink_intra: " + std::to_string(kEpochSlots) +
                                                   " regions are registered already (its epoch table is full)");
  }
  return std::make_pair(slot, values_[slot].load(std::memory_order_acquire));
}

void LocalEpochs::Advance(uint32_t slot) {
  if (slot < kEpochSlots) values_[slot].fetch_add(1, std::memory_order_acq_rel);
}

void LocalEpochs::Release(uint32_t slot) {
  if (slot >= kEpochSlots) return;
  values_[slot].fetch_add(1, std::memory_order_acq_rel);
  std::lock_guard lock(mu_);
  free_.push_back(slot);
}

uint64_t LocalEpochs::value(uint32_t slot) const {
  return slot < kEpochSlots ? values_[slot].load(std::memory_order_acquire) : 0;
}

PeerEpochs::~PeerEpochs() {
  for (auto& [instance, page] : pages_) munmap(page.base, kEpochTableBytes);
}

Status PeerEpochs::Check(const SegmentDescriptor& desc, const BufferDescriptor& buffer) {
  const std::string instance = JsonString(desc.json, "instance").value_or("");
  const std::optional<int64_t> fd = JsonInt(desc.json, kEpochFdField);
  const std::optional<int64_t> pid = JsonInt(desc.json, "pid");
  const std::optional<uint64_t> slot = JsonUint(buffer.json, kEpochSlotField);
  const std::optional<uint64_t> expected = JsonUint(buffer.json, kEpochField);
  if (instance.empty() || !fd || *fd < 0 || !pid || *pid <= 0 || !slot || *slot >= kEpochSlots || !expected) {
    return Status(ErrorCode::kMalformedJson, "nvlink_intra: segment '" + desc.name +
                                                 "' publishes no registration epoch its buffer can be checked by");
  }
  std::lock_guard lock(mu_);
  auto it = pages_.find(instance);
  if (it == pages_.end()) {
    auto local = OpenPeerFd(*pid, *fd);
    if (!local.ok()) return local.status();
    void* base = mmap(nullptr, kEpochTableBytes, PROT_READ, MAP_SHARED, *local, 0);
    const int err = errno;
    close(*local);
    if (base == MAP_FAILED) {
      return Status(ErrorCode::kRemoteRejected, std::string("nvlink_intra: mapping the epoch table: ") + strerror(err));
    }
    it = pages_.emplace(instance, Page{desc.name, static_cast<const std::atomic<uint64_t>*>(base), base}).first;
  }
  if (it->second.values[*slot].load(std::memory_order_acquire) != *expected) {
    return Status(ErrorCode::kStaleMetadata, "nvlink_intra: '" + desc.name + "' unregistered buffer " +
                                                 Hex(buffer.addr) + " since its descriptor was fetched; refresh it");
  }
  return Status::Ok();
}

void PeerEpochs::Forget(const std::string& segment_name) {
  std::lock_guard lock(mu_);
  for (auto it = pages_.begin(); it != pages_.end();) {
    if (it->second.segment == segment_name) {
      munmap(it->second.base, kEpochTableBytes);
      it = pages_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace mooncake::te::nvlink_intra
