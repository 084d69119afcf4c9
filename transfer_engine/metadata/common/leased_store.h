#ifndef MOONCAKE_TRANSFER_ENGINE_METADATA_COMMON_LEASED_STORE_H_
#define MOONCAKE_TRANSFER_ENGINE_METADATA_COMMON_LEASED_STORE_H_

#include <mutex>
#include <string>

#include "transfer_engine/core/metadata.h"
#include "transfer_engine/metadata/common/owned_keys.h"

namespace mooncake::te {

/// A KeyValueStore whose keys live on the server's lease or TTL (etcd, Redis): every key it wrote is
/// remembered in `owned_` (with its guard) for the backend's keep-alive to write again. The public writes are
/// written once here, on three primitives each backend provides.
///
/// Threading: `mu_` guards `owned_` and whatever else the backend says; the primitives are called with it
/// held.
class LeasedKeyValueStore : public KeyValueStore {
 public:
  Status Put(const std::string& key, const std::string& value) override {
    std::lock_guard lock(mu_);
    MC_RETURN_IF_ERROR(PutLocked(key, value));
    owned_.Set(key, value);
    return Status::Ok();
  }

  StatusOr<bool> Create(const std::string& key, const std::string& value) override {
    std::lock_guard lock(mu_);
    auto created = CreateLocked(key, value);
    if (created.ok() && *created) owned_.Set(key, value);
    return created;
  }

  StatusOr<bool> Adopt(const std::string& key, const std::string& value) override {
    std::lock_guard lock(mu_);
    auto adopted = PutIfValueLocked(key, value, key, value);
    if (adopted.ok() && *adopted) owned_.Set(key, value);
    return adopted;
  }

  StatusOr<bool> PutGuarded(const std::string& key, const std::string& value, const std::string& guard,
                            const std::string& guard_value) override {
    std::lock_guard lock(mu_);
    auto put = PutIfValueLocked(key, value, guard, guard_value);
    if (put.ok() && *put) owned_.Set(key, value, guard);
    return put;
  }

  bool Owns(const std::string& key) override {
    std::lock_guard lock(mu_);
    return owned_.Contains(key);
  }

 protected:
  /// Writes `key` on our lease / TTL, whatever it held.
  virtual Status PutLocked(const std::string& key, const std::string& value) = 0;
  /// Writes `key` only if it does not exist; false when it did (nothing written).
  virtual StatusOr<bool> CreateLocked(const std::string& key, const std::string& value) = 0;
  /// Writes `key` only while `guard` holds `guard_value`, atomically; false when it did not.
  virtual StatusOr<bool> PutIfValueLocked(const std::string& key, const std::string& value, const std::string& guard,
                                          const std::string& guard_value) = 0;

  std::mutex mu_;
  OwnedKeys owned_;
};

}  // namespace mooncake::te

#endif  // MOONCAKE_TRANSFER_ENGINE_METADATA_COMMON_LEASED_STORE_H_
