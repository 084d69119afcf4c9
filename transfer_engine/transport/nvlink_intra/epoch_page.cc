#include "transfer_engine/transport/nvlink_intra/epoch_page.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>

namespace mooncake::te::nvlink_intra {
namespace {

constexpr size_t kPage = 4096;

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
  if (seals < 0 || !(seals & F_SEAL_SHRINK) || fstat(local, &st) != 0 || st.st_size < static_cast<off_t>(kPage)) {
    close(local);
    return Status(ErrorCode::kRemoteRejected, "nvlink_intra: " + path + " is not a sealed epoch page");
  }
  return local;
}

}  // namespace

LocalEpoch::LocalEpoch() {
  int fd = memfd_create("mc-nvlink-intra-epoch", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return;
  void* p = MAP_FAILED;
  if (ftruncate(fd, kPage) == 0 && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == 0) {
    p = mmap(nullptr, kPage, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  if (p == MAP_FAILED) {
    close(fd);
    return;
  }
  fd_ = fd;
  value_ = new (p) std::atomic<uint64_t>(0);
}

LocalEpoch::~LocalEpoch() {
  if (fd_ < 0) return;
  munmap(static_cast<void*>(value_), kPage);
  close(fd_);
}

PeerEpochs::~PeerEpochs() {
  for (auto& [instance, page] : pages_) munmap(page.base, kPage);
}

Status PeerEpochs::Check(const SegmentDescriptor& desc) {
  const std::string instance = JsonString(desc.json, "instance").value_or("");
  const std::optional<uint64_t> expected = JsonUint(desc.json, kEpochField);
  const std::optional<int64_t> fd = JsonInt(desc.json, kEpochFdField);
  const std::optional<int64_t> pid = JsonInt(desc.json, "pid");
  if (instance.empty() || !expected || !fd || *fd < 0 || !pid || *pid <= 0) {
    return Status(ErrorCode::kMalformedJson,
                  "nvlink_intra: segment '" + desc.name + "' publishes no registration epoch it can be checked by");
  }
  std::lock_guard lock(mu_);
  auto it = pages_.find(instance);
  if (it == pages_.end()) {
    auto local = OpenPeerFd(*pid, *fd);
    if (!local.ok()) return local.status();
    void* base = mmap(nullptr, kPage, PROT_READ, MAP_SHARED, *local, 0);
    const int err = errno;
    close(*local);
    if (base == MAP_FAILED) {
      return Status(ErrorCode::kRemoteRejected, std::string("nvlink_intra: mapping the epoch page: ") + strerror(err));
    }
    it = pages_.emplace(instance, Page{desc.name, static_cast<const std::atomic<uint64_t>*>(base), base}).first;
  }
  if (it->second.value->load(std::memory_order_acquire) != *expected) {
    return Status(ErrorCode::kStaleMetadata, "nvlink_intra: '" + desc.name +
                                                 "' unregistered memory since its descriptor was fetched; refresh it");
  }
  return Status::Ok();
}

void PeerEpochs::Forget(const std::string& segment_name) {
  std::lock_guard lock(mu_);
  for (auto it = pages_.begin(); it != pages_.end();) {
    if (it->second.segment == segment_name) {
      munmap(it->second.base, kPage);
      it = pages_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace mooncake::te::nvlink_intra
