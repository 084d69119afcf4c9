#include "transfer_engine/transport/device_ipc/ipc_cache.h"

#include "transfer_engine/common/format.h"
#include "transfer_engine/common/log.h"
#include "transfer_engine/transport/device_ipc/handle_hex.h"

namespace mooncake::te::device_ipc {

MappingOps IpcMappingOps(std::shared_ptr<Platform> platform, std::string what) {
  MappingOps ops;
  ops.what = std::move(what);
  ops.import = [platform](const std::string& handle, int pid, size_t length) {
    return platform->ImportIpc(handle, pid, length);
  };
  ops.close = [platform](void* mapped, size_t length) { return platform->CloseIpc(mapped, length); };
  return ops;
}

PeerMapping::~PeerMapping() {
  Status st = ops_->close(base_, length_);
  if (!st.ok()) MC_LOG(kWarning) << ops_->what << ": unmapping a peer buffer failed: " << st.message();
}

StatusOr<std::shared_ptr<PeerMapping>> IpcCache::Get(const SegmentDescriptor& desc, const BufferDescriptor& buffer) {
  const std::string instance = JsonString(desc.json, "instance").value_or("");
  const std::optional<int64_t> pid = JsonInt(desc.json, "pid");
  const std::optional<std::string> hex = JsonString(buffer.json, "shm_name");
  if (!pid || *pid <= 0 || *pid > INT32_MAX) {
    return Status(ErrorCode::kMalformedJson, ops_->what + ": segment '" + desc.name + "' publishes no valid pid");
  }
  if (!hex) {
    return Status(ErrorCode::kMalformedJson, ops_->what + ": buffer " + Range(buffer.addr, buffer.length) +
                                                 " of segment '" + desc.name + "' has no IPC handle (shm_name)");
  }
  auto handle = HandleFromHex(*hex);
  if (!handle.ok()) return handle.status();
  std::lock_guard lock(mu_);
  auto key = std::make_pair(instance, buffer.addr);
  auto it = entries_.find(key);
  if (it != entries_.end()) {
    if (it->second.handle == *handle && it->second.length == buffer.length) {
      it->second.last_use = ++use_clock_;
      return it->second.mapping;
    }
    entries_.erase(it);  // re-registered under the same address: the old mapping goes once unused
  }
  while (entries_.size() >= max_entries_ && EvictOneLocked()) {
  }
  auto mapped = ops_->import(*handle, static_cast<int>(*pid), buffer.length);
  if (!mapped.ok()) {
    return Status(mapped.status().code(), ops_->what + ": mapping buffer " + Range(buffer.addr, buffer.length) +
                                              " of segment '" + desc.name + "': " + mapped.status().message());
  }
  auto mapping = std::make_shared<PeerMapping>(ops_, static_cast<char*>(*mapped), buffer.length);
  entries_[key] = Entry{desc.name, std::move(handle.value()), buffer.length, mapping, ++use_clock_};
  ++imports_[desc.name];
  return mapping;
}

size_t IpcCache::Forget(const std::string& segment_name) {
  std::lock_guard lock(mu_);
  size_t n = 0;
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (it->second.segment == segment_name) {
      it = entries_.erase(it);
      ++n;
    } else {
      ++it;
    }
  }
  return n;
}

bool IpcCache::EvictOneLocked() {
  auto victim = entries_.end();
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    // use_count() == 1: only the cache holds it, and nobody can take it without mu_.
    if (it->second.mapping.use_count() == 1 && (victim == entries_.end() || it->second.last_use < victim->second.last_use)) {
      victim = it;
    }
  }
  if (victim == entries_.end()) return false;
  entries_.erase(victim);  // unmapped here: no copy holds it
  ++evictions_;
  return true;
}

void IpcCache::ForgetBuffer(const std::string& instance, uint64_t buffer_addr) {
  std::lock_guard lock(mu_);
  entries_.erase({instance, buffer_addr});
}

uint64_t IpcCache::evictions() const {
  std::lock_guard lock(mu_);
  return evictions_;
}

void IpcCache::Clear() {
  std::lock_guard lock(mu_);
  entries_.clear();
}

size_t IpcCache::size() const {
  std::lock_guard lock(mu_);
  return entries_.size();
}

std::map<std::string, std::pair<size_t, uint64_t>> IpcCache::CountBySegment() const {
  std::lock_guard lock(mu_);
  std::map<std::string, std::pair<size_t, uint64_t>> out;
  for (const auto& [segment, n] : imports_) out[segment].second = n;
  for (const auto& [key, e] : entries_) ++out[e.segment].first;
  return out;
}

}  // namespace mooncake::te::device_ipc
