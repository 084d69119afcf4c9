#include "transfer_engine/transport/device_ipc/epoch_page.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>

#include "transfer_engine/common/format.h"

namespace mooncake::te::device_ipc {
namespace {

// Opens the peer's fd `fd` through /proc (read access to the peer: same user or root), read-only.
StatusOr<int> OpenPeerFd(const std::string& what, int64_t pid, int64_t fd) {
  std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
  int local = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (local < 0) {
    return Status(errno == ENOENT ? ErrorCode::kPeerUnreachable : ErrorCode::kRemoteRejected,
                  what + ": cannot open the epoch page " + path + ": " + strerror(errno));
  }
  // Only a memfd whose size is sealed at a page or more: a peer cannot shrink it under our mapping (SIGBUS).
  struct stat st;
  int seals = fcntl(local, F_GET_SEALS);
  if (seals < 0 || !(seals & F_SEAL_SHRINK) || fstat(local, &st) != 0 ||
      st.st_size < static_cast<off_t>(kEpochTableBytes)) {
    close(local);
    return Status(ErrorCode::kRemoteRejected, what + ": " + path + " is not a sealed epoch table");
  }
  return local;
}

}  // namespace

EpochFields EpochFields::For(const std::string& transport) {
  return EpochFields{transport + "_epoch_fd", transport + "_epoch_slot", transport + "_epoch"};
}

LocalEpochs::LocalEpochs(const std::string& memfd_name) {
  int fd = memfd_create(memfd_name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
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

LocalEpochs::LocalEpochs(std::function<void(uint32_t, uint64_t)> publish) : publish_(std::move(publish)) {
  private_.reset(new std::atomic<uint64_t>[kEpochSlots]);
  for (size_t i = 0; i < kEpochSlots; ++i) private_[i].store(0);
  values_ = private_.get();
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
    return Status(ErrorCode::kTooManyRequests, std::to_string(kEpochSlots) +
                                                   " regions are registered already (the epoch table is full)");
  }
  return std::make_pair(slot, values_[slot].load(std::memory_order_acquire));
}

void LocalEpochs::Bump(uint32_t slot) {
  if (!publish_) {
    values_[slot].fetch_add(1, std::memory_order_acq_rel);
    return;
  }
  std::lock_guard lock(publish_mu_);
  publish_(slot, values_[slot].fetch_add(1, std::memory_order_acq_rel) + 1);
}

void LocalEpochs::Advance(uint32_t slot) {
  if (slot < kEpochSlots) Bump(slot);
}

void LocalEpochs::Release(uint32_t slot) {
  if (slot >= kEpochSlots) return;
  Bump(slot);
  std::lock_guard lock(mu_);
  free_.push_back(slot);
}

uint64_t LocalEpochs::value(uint32_t slot) const {
  return slot < kEpochSlots ? values_[slot].load(std::memory_order_acquire) : 0;
}

std::map<std::string, uint64_t> PeerEpochs::ReadCounts() const {
  std::lock_guard lock(count_mu_);
  return reads_;
}

Status PeerEpochs::Check(const SegmentDescriptor& desc, const BufferDescriptor& buffer, EpochReads* reads) {
  const std::string instance = JsonString(desc.json, "instance").value_or("");
  const std::optional<uint64_t> slot = JsonUint(buffer.json, fields_.slot.c_str());
  const std::optional<uint64_t> expected = JsonUint(buffer.json, fields_.value.c_str());
  if (instance.empty() || !slot || *slot >= kEpochSlots || !expected) {
    return Status(ErrorCode::kMalformedJson, what_ + ": segment '" + desc.name +
                                                 "' publishes no registration epoch its buffer can be checked by");
  }
  const auto at = static_cast<uint32_t>(*slot);
  EpochReads own;  // without a submission's reads: this check's alone
  if (reads == nullptr) reads = &own;
  auto known = reads->find(at);
  if (known == reads->end()) {
    known = reads->emplace(at, Read(desc, instance, at)).first;
    std::lock_guard lock(count_mu_);
    ++reads_[desc.name];
  }
  const StatusOr<uint64_t>& now = known->second;
  if (!now.ok()) return now.status();
  if (*now != *expected) {
    return Status(ErrorCode::kStaleMetadata, what_ + ": '" + desc.name + "' unregistered buffer " +
                                                 Hex(buffer.addr) + " since its descriptor was fetched; refresh it");
  }
  return Status::Ok();
}

ProcPeerEpochs::~ProcPeerEpochs() {
  for (auto& [instance, page] : pages_) munmap(page.base, kEpochTableBytes);
}

StatusOr<uint64_t> ProcPeerEpochs::Read(const SegmentDescriptor& desc, const std::string& instance, uint32_t slot) {
  std::lock_guard lock(mu_);
  auto it = pages_.find(instance);
  if (it == pages_.end()) {
    const std::optional<int64_t> fd = JsonInt(desc.json, fields_.table.c_str());
    const std::optional<int64_t> pid = JsonInt(desc.json, "pid");
    if (!fd || *fd < 0 || !pid || *pid <= 0) {
      return Status(ErrorCode::kMalformedJson,
                    what_ + ": segment '" + desc.name + "' publishes no epoch table (" + fields_.table + ", pid)");
    }
    auto local = OpenPeerFd(what_, *pid, *fd);
    if (!local.ok()) return local.status();
    void* base = mmap(nullptr, kEpochTableBytes, PROT_READ, MAP_SHARED, *local, 0);
    const int err = errno;
    close(*local);
    if (base == MAP_FAILED) {
      return Status(ErrorCode::kRemoteRejected, what_ + ": mapping the epoch table: " + strerror(err));
    }
    it = pages_.emplace(instance, Page{desc.name, static_cast<const std::atomic<uint64_t>*>(base), base}).first;
  }
  return it->second.values[slot].load(std::memory_order_acquire);
}

void ProcPeerEpochs::Forget(const std::string& segment_name) {
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

}  // namespace mooncake::te::device_ipc
