#ifndef MOONCAKE_TRANSFER_ENGINE_METADATA_COMMON_OWNED_KEYS_H_
#define MOONCAKE_TRANSFER_ENGINE_METADATA_COMMON_OWNED_KEYS_H_

#include <map>
#include <string>
#include <vector>

namespace mooncake::te {

/// The keys a KeyValueStore keeps alive (see KeyValueStore in core/metadata.h), with the guard each one is
/// kept under. Not thread-safe: the store's own lock guards it.
class OwnedKeys {
 public:
  struct Entry {
    std::string value;
    std::string guard;  ///< empty: not guarded
  };

  void Set(const std::string& key, std::string value, std::string guard = "") {
    keys_[key] = Entry{std::move(value), std::move(guard)};
  }
  const Entry* Find(const std::string& key) const {
    auto it = keys_.find(key);
    return it == keys_.end() ? nullptr : &it->second;
  }
  bool Contains(const std::string& key) const { return keys_.count(key) != 0; }
  size_t size() const { return keys_.size(); }

  /// Stops keeping `key` if it still holds `value` (an older value was replaced by a newer write).
  void EraseIfValue(const std::string& key, const std::string& value) {
    auto it = keys_.find(key);
    if (it != keys_.end() && it->second.value == value) keys_.erase(it);
  }
  /// Stops keeping `key` and every key guarded by it: the keys dropped (`key` first).
  std::vector<std::string> Drop(const std::string& key) {
    std::vector<std::string> dropped;
    if (keys_.erase(key)) dropped.push_back(key);
    for (auto it = keys_.begin(); it != keys_.end();) {
      if (it->second.guard == key) {
        dropped.push_back(it->first);
        it = keys_.erase(it);
      } else {
        ++it;
      }
    }
    return dropped;
  }
  /// Every key, guards before the keys they guard: the order to write them back in.
  std::vector<std::string> GuardsFirst() const {
    std::vector<std::string> out;
    for (const auto& [key, e] : keys_) {
      if (e.guard.empty()) out.push_back(key);
    }
    for (const auto& [key, e] : keys_) {
      if (!e.guard.empty()) out.push_back(key);
    }
    return out;
  }
  /// The value `key`'s guard must hold for `key` to be written back; null when the guard is no longer kept
  /// (then neither is `key`: Drop removed both) or `key` is not guarded.
  const std::string* GuardValue(const std::string& key) const {
    const Entry* e = Find(key);
    if (!e || e->guard.empty()) return nullptr;
    const Entry* g = Find(e->guard);
    return g ? &g->value : nullptr;
  }

 private:
  std::map<std::string, Entry> keys_;
};

}  // namespace mooncake::te

#endif  // MOONCAKE_TRANSFER_ENGINE_METADATA_COMMON_OWNED_KEYS_H_
