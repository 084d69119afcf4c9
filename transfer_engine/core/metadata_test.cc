// KeyValueMetadataBackend's claim logic over an in-process key-value store that can be made to fail reads
// (what etcd leader changes, HTTP 5xx and timeouts look like). The real stores are covered end to end by
// python/mooncake/engine_metadata_test.py against real etcd, Redis and HTTP servers.
#include "transfer_engine/core/metadata.h"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>

namespace mooncake::te {
namespace {

class MemoryStore : public KeyValueStore {
 public:
  struct State {
    std::map<std::string, std::string> data;
    int gets_left = 1 << 30;  // Gets that still succeed; later ones fail with kMetadata
    int adopted = 0;
  };
  explicit MemoryStore(State* s) : s_(s) {}

  StatusOr<std::string> Get(const std::string& key) override {
    if (s_->gets_left-- <= 0) return Status(ErrorCode::kMetadata, "injected read failure");
    auto it = s_->data.find(key);
    if (it == s_->data.end()) return NotFound("absent");
    return it->second;
  }
  Status Put(const std::string& key, const std::string& value) override {
    s_->data[key] = value;
    return Status::Ok();
  }
  StatusOr<bool> Create(const std::string& key, const std::string& value) override {
    return s_->data.emplace(key, value).second;
  }
  StatusOr<bool> Adopt(const std::string& key, const std::string& value) override {
    ++s_->adopted;
    auto it = s_->data.find(key);
    return it != s_->data.end() && it->second == value;
  }
  StatusOr<bool> PutGuarded(const std::string& key, const std::string& value, const std::string& guard,
                            const std::string& guard_value) override {
    auto g = s_->data.find(guard);
    if (g == s_->data.end() || g->second != guard_value) return false;
    s_->data[key] = value;
    return true;
  }
  Status DeleteIfValue(const std::string& key, const std::string& value) override {
    auto it = s_->data.find(key);
    if (it != s_->data.end() && it->second == value) s_->data.erase(it);
    return Status::Ok();
  }
  bool Owns(const std::string&) override { return true; }

 private:
  State* s_;
};

const char kRpcKey[] = "mooncake/rpc_meta/n";
const char kRamKey[] = "mooncake/ram/n";
const net::HostPort kUs{"127.0.0.1", 4000};

std::string Entry(const std::string& host, int port) {
  return R"({"ip_or_host_name":")" + host + R"(","rpc_port":)" + std::to_string(port) + "}";
}

// The liveness check is decided on the entry read once: a failing later read must neither skip it nor let
// the live owner's entry be deleted.
TEST(KeyValueMetadataTest, ALiveOwnerKeepsItsNameWhenReadsFail) {
  MemoryStore::State s;
  s.data[kRpcKey] = Entry("10.1.2.3", 5000);
  s.gets_left = 1;
  KeyValueMetadataBackend backend(std::make_unique<MemoryStore>(&s), "");
  int checks = 0;
  Status st = backend.PublishRpcAddress("n", kUs, [&](const net::HostPort& owner) {
    ++checks;
    EXPECT_EQ(owner.ToString(), "10.1.2.3:5000");
    return Status(ErrorCode::kMetadata, "alive");
  });
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(checks, 1);
  EXPECT_EQ(s.data[kRpcKey], Entry("10.1.2.3", 5000));
}

TEST(KeyValueMetadataTest, AReadErrorIsReturnedAndNothingIsDeleted) {
  MemoryStore::State s;
  s.data[kRpcKey] = Entry("10.1.2.3", 5000);
  s.gets_left = 0;
  KeyValueMetadataBackend backend(std::make_unique<MemoryStore>(&s), "");
  Status st = backend.PublishRpcAddress("n", kUs, [](const net::HostPort&) { return Status::Ok(); });
  EXPECT_EQ(st.code(), ErrorCode::kMetadata) << st.ToString();
  EXPECT_EQ(s.data[kRpcKey], Entry("10.1.2.3", 5000));
}

TEST(KeyValueMetadataTest, OurOwnEntryIsAdoptedAndMalformedOnesReplaced) {
  for (const std::string& bad : {std::string("not json"), Entry("127.0.0.1", 70000), Entry("127.0.0.1", 0),
                                 Entry("", 4000), std::string(R"({"ip_or_host_name":"h","rpc_port":-1})")}) {
    MemoryStore::State s;
    s.data[kRpcKey] = bad;
    KeyValueMetadataBackend backend(std::make_unique<MemoryStore>(&s), "");
    Status st = backend.PublishRpcAddress("n", kUs, [&](const net::HostPort& owner) {
      ADD_FAILURE() << "no owner to check in " << bad << ", got " << owner.ToString();
      return Status::Ok();
    });
    EXPECT_TRUE(st.ok()) << bad << ": " << st.ToString();
    EXPECT_EQ(s.data[kRpcKey], Entry("127.0.0.1", 4000)) << bad;
  }
  MemoryStore::State s;
  s.data[kRpcKey] = Entry("127.0.0.1", 4000);
  KeyValueMetadataBackend backend(std::make_unique<MemoryStore>(&s), "");
  ASSERT_TRUE(backend.PublishRpcAddress("n", kUs, [](const net::HostPort&) { return Status::Ok(); }).ok());
  EXPECT_EQ(s.adopted, 1);
}

TEST(KeyValueMetadataTest, RpcValuesOutsideThePortRangeAreMalformed) {
  EXPECT_EQ(KeyValueMetadataBackend::ParseRpcValue("n", Entry("h", 65536)).status().code(),
            ErrorCode::kMalformedJson);
  auto ok = KeyValueMetadataBackend::ParseRpcValue("n", Entry("h", 65535));
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->port, 65535);
}

// After the claim went to another engine, the descriptor is not written over the new owner's, and every
// later publication fails; Unpublish then removes nothing of the new owner's.
TEST(KeyValueMetadataTest, ALostNameIsNeitherPublishedNorRemoved) {
  MemoryStore::State s;
  KeyValueMetadataBackend backend(std::make_unique<MemoryStore>(&s), "");
  ASSERT_TRUE(backend.PublishRpcAddress("n", kUs, [](const net::HostPort&) { return Status::Ok(); }).ok());
  ASSERT_TRUE(backend.PublishSegment("n", "ours-1").ok());
  EXPECT_EQ(s.data[kRamKey], "ours-1");
  s.data[kRpcKey] = Entry("10.9.9.9", 6000);  // taken over
  s.data[kRamKey] = "theirs";
  EXPECT_EQ(backend.PublishSegment("n", "ours-2").code(), ErrorCode::kMetadata);
  EXPECT_EQ(s.data[kRamKey], "theirs");
  EXPECT_EQ(backend.PublishSegment("n", "ours-3").code(), ErrorCode::kMetadata);
  EXPECT_TRUE(backend.Unpublish("n").ok());
  EXPECT_EQ(s.data[kRamKey], "theirs");
  EXPECT_EQ(s.data[kRpcKey], Entry("10.9.9.9", 6000));
}

TEST(KeyValueMetadataTest, NothingIsPublishedAfterUnpublish) {
  MemoryStore::State s;
  KeyValueMetadataBackend backend(std::make_unique<MemoryStore>(&s), "");
  ASSERT_TRUE(backend.PublishRpcAddress("n", kUs, [](const net::HostPort&) { return Status::Ok(); }).ok());
  ASSERT_TRUE(backend.PublishSegment("n", "ours").ok());
  ASSERT_TRUE(backend.Unpublish("n").ok());
  EXPECT_TRUE(s.data.empty());
  EXPECT_FALSE(backend.PublishSegment("n", "late").ok());
  EXPECT_TRUE(s.data.empty());
}

}  // namespace
}  // namespace mooncake::te
