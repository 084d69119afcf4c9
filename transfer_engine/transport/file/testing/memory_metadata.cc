#include "transfer_engine/transport/file/testing/memory_metadata.h"

#include <map>
#include <memory>
#include <mutex>

#include "transfer_engine/core/metadata.h"

namespace mooncake::te::file::testing {
namespace {

struct Stores {
  std::mutex mu;
  std::map<std::string, std::map<std::string, std::string>> data;  // store -> key -> value
};

Stores& All() {
  static Stores* s = new Stores();  // never destroyed: engines may outlive static destruction order
  return *s;
}

class MemoryStore : public KeyValueStore {
 public:
  explicit MemoryStore(std::string name) : name_(std::move(name)) {}

  StatusOr<std::string> Get(const std::string& key) override {
    std::lock_guard lock(All().mu);
    auto& m = All().data[name_];
    auto it = m.find(key);
    if (it == m.end()) return NotFound("no key '" + key + "'");
    return it->second;
  }
  Status Put(const std::string& key, const std::string& value) override {
    std::lock_guard lock(All().mu);
    All().data[name_][key] = value;
    return Status::Ok();
  }
  StatusOr<bool> Create(const std::string& key, const std::string& value) override {
    std::lock_guard lock(All().mu);
    return All().data[name_].emplace(key, value).second;
  }
  StatusOr<bool> Adopt(const std::string& key, const std::string& value) override {
    std::lock_guard lock(All().mu);
    auto& m = All().data[name_];
    auto it = m.find(key);
    return it != m.end() && it->second == value;
  }
  StatusOr<bool> PutGuarded(const std::string& key, const std::string& value, const std::string& guard,
                            const std::string& guard_value) override {
    std::lock_guard lock(All().mu);
    auto& m = All().data[name_];
    auto g = m.find(guard);
    if (g == m.end() || g->second != guard_value) return false;
    m[key] = value;
    return true;
  }
  Status DeleteIfValue(const std::string& key, const std::string& value) override {
    std::lock_guard lock(All().mu);
    auto& m = All().data[name_];
    auto it = m.find(key);
    if (it != m.end() && it->second == value) m.erase(it);
    return Status::Ok();
  }
  bool Owns(const std::string& /*key*/) override { return true; }

 private:
  std::string name_;
};

StatusOr<std::unique_ptr<MetadataBackend>> CreateMemoryBackend(const MetadataContext& ctx) {
  return std::unique_ptr<MetadataBackend>(
      new KeyValueMetadataBackend(std::make_unique<MemoryStore>(ctx.location), ""));
}

}  // namespace

std::optional<std::string> MemoryMetadataGet(const std::string& store, const std::string& key) {
  std::lock_guard lock(All().mu);
  auto& m = All().data[store];
  auto it = m.find(key);
  if (it == m.end()) return std::nullopt;
  return it->second;
}

void MemoryMetadataPut(const std::string& store, const std::string& key, const std::string& value) {
  std::lock_guard lock(All().mu);
  All().data[store][key] = value;
}

}  // namespace mooncake::te::file::testing

MC_REGISTER_METADATA_BACKEND("memkv", memkv, ::mooncake::te::file::testing::CreateMemoryBackend);
