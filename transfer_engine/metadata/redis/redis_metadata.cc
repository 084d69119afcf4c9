// Redis metadata backend ("redis://host:port"), with hiredis. Keys this engine writes carry a TTL of
// MC_METADATA_LEASE_TTL seconds, refreshed from a background thread (re-written if Redis lost them): a crashed
// engine's keys expire. Auth and database: MC_REDIS_USERNAME, MC_REDIS_PASSWORD, MC_REDIS_DB_INDEX (0-255).
#include <hiredis/hiredis.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "transfer_engine/common/log.h"
#include "transfer_engine/common/net.h"
#include "transfer_engine/core/metadata.h"
#include "transfer_engine/metadata/common/periodic.h"

namespace mooncake::te {
namespace {

struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

class RedisKeyValueStore : public KeyValueStore {
 public:
  RedisKeyValueStore(net::HostPort addr, std::chrono::seconds ttl) : addr_(std::move(addr)), ttl_(ttl) {}

  ~RedisKeyValueStore() override {
    refresher_.reset();
    std::lock_guard lock(mu_);
    if (ctx_) redisFree(ctx_);
  }

  Status Start() {
    {
      std::lock_guard lock(mu_);
      MC_RETURN_IF_ERROR(ConnectLocked());
    }
    auto interval = std::chrono::duration_cast<std::chrono::milliseconds>(ttl_) / 3;
    refresher_ = std::make_unique<Periodic>(interval, [this] { Refresh(); });
    return Status::Ok();
  }

  StatusOr<std::string> Get(const std::string& key) override {
    std::lock_guard lock(mu_);
    auto r = CommandLocked({"GET", key});
    if (!r.ok()) return r.status();
    if ((*r)->type == REDIS_REPLY_NIL) return NotFound("no key '" + key + "' in redis");
    if ((*r)->type != REDIS_REPLY_STRING) return Status(ErrorCode::kMetadata, "redis GET: unexpected reply");
    return std::string((*r)->str, (*r)->len);
  }

  Status Put(const std::string& key, const std::string& value) override {
    std::lock_guard lock(mu_);
    owned_[key] = value;
    return SetLocked(key, value);
  }

  Status Delete(const std::string& key) override {
    std::lock_guard lock(mu_);
    owned_.erase(key);
    auto r = CommandLocked({"DEL", key});
    return r.ok() ? Status::Ok() : r.status();
  }

 private:
  Status ConnectLocked() {
    if (ctx_) redisFree(ctx_);
    timeval tv{3, 0};
    ctx_ = redisConnectWithTimeout(addr_.host.c_str(), addr_.port, tv);
    if (ctx_ == nullptr || ctx_->err) {
      std::string why = ctx_ ? ctx_->errstr : "out of memory";
      if (ctx_) redisFree(ctx_);
      ctx_ = nullptr;
      return Status(ErrorCode::kMetadata, "cannot reach redis at " + addr_.ToString() + ": " + why);
    }
    redisSetTimeout(ctx_, tv);
    const char* user = getenv("MC_REDIS_USERNAME");
    const char* password = getenv("MC_REDIS_PASSWORD");
    if (password && *password) {
      std::vector<std::string> auth = {"AUTH"};
      if (user && *user) auth.push_back(user);
      auth.push_back(password);
      auto r = RawLocked(auth);
      if (!r.ok()) return r.status();
    }
    const char* db = getenv("MC_REDIS_DB_INDEX");
    if (db && *db) {
      int index = atoi(db);
      if (index < 0 || index > 255) return InvalidArgument("MC_REDIS_DB_INDEX must be 0-255, got " + std::string(db));
      auto r = RawLocked({"SELECT", std::to_string(index)});
      if (!r.ok()) return r.status();
    }
    return Status::Ok();
  }

  StatusOr<Reply> RawLocked(const std::vector<std::string>& args) {
    std::vector<const char*> argv;
    std::vector<size_t> lens;
    for (const auto& a : args) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    Reply r(static_cast<redisReply*>(redisCommandArgv(ctx_, static_cast<int>(argv.size()), argv.data(), lens.data())));
    if (!r) return Status(ErrorCode::kMetadata, "redis " + args[0] + " at " + addr_.ToString() + ": " + ctx_->errstr);
    if (r->type == REDIS_REPLY_ERROR) {
      return Status(ErrorCode::kMetadata, "redis " + args[0] + ": " + std::string(r->str, r->len));
    }
    return r;
  }

  // One reconnect on a broken connection (Redis restarted, idle timeout).
  StatusOr<Reply> CommandLocked(const std::vector<std::string>& args) {
    if (ctx_ && !ctx_->err) {
      auto r = RawLocked(args);
      if (r.ok() || (ctx_ && !ctx_->err)) return r;
    }
    MC_RETURN_IF_ERROR(ConnectLocked());
    return RawLocked(args);
  }

  Status SetLocked(const std::string& key, const std::string& value) {
    auto r = CommandLocked({"SET", key, value, "EX", std::to_string(ttl_.count())});
    return r.ok() ? Status::Ok() : r.status();
  }

  void Refresh() {
    std::lock_guard lock(mu_);
    for (const auto& [key, value] : owned_) {
      auto r = CommandLocked({"EXPIRE", key, std::to_string(ttl_.count())});
      if (r.ok() && (*r)->type == REDIS_REPLY_INTEGER && (*r)->integer == 1) continue;
      Status st = r.ok() ? SetLocked(key, value) : r.status();  // lost (expired, or Redis restarted): rewrite
      if (!st.ok()) MC_LOG(kWarning) << "redis: keeping '" << key << "' alive failed: " << st.message();
    }
  }

  net::HostPort addr_;
  std::chrono::seconds ttl_;
  std::mutex mu_;  // guards ctx_, owned_
  redisContext* ctx_ = nullptr;
  std::map<std::string, std::string> owned_;
  std::unique_ptr<Periodic> refresher_;
};

StatusOr<std::unique_ptr<MetadataBackend>> CreateRedisBackend(const MetadataContext& ctx) {
  std::string location = ctx.location;
  while (!location.empty() && location.back() == '/') location.pop_back();
  auto addr = net::ParseHostPort(location, 6379);
  if (!addr.ok()) return addr.status();
  auto store = std::make_unique<RedisKeyValueStore>(*addr, ctx.config->metadata_lease_ttl);
  MC_RETURN_IF_ERROR(store->Start());
  return std::unique_ptr<MetadataBackend>(
      new KeyValueMetadataBackend(std::move(store), ctx.config->metadata_cluster_id));
}

}  // namespace

MC_REGISTER_METADATA_BACKEND("redis", redis, CreateRedisBackend);

}  // namespace mooncake::te
