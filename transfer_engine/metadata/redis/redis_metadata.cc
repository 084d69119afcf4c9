// Redis metadata backend ("redis://host:port"), with hiredis. Keys this engine writes carry a TTL of
// MC_METADATA_LEASE_TTL seconds, refreshed from a background thread (re-written if Redis lost them): a crashed
// engine's keys expire. Names are claimed with SET NX; compare-and-set / compare-and-delete run as Lua scripts
// (EVAL), or, where the server refuses scripting (ACL, renamed command), as WATCH/MULTI/EXEC transactions.
// Auth and database: MC_REDIS_USERNAME, MC_REDIS_PASSWORD, MC_REDIS_DB_INDEX (0-255).
#include <hiredis/hiredis.h>

#include <cstdlib>
#include <functional>
#include <optional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "transfer_engine/common/log.h"
#include "transfer_engine/common/net.h"
#include "transfer_engine/core/metadata.h"
#include "transfer_engine/metadata/common/leased_store.h"
#include "transfer_engine/metadata/common/periodic.h"

namespace mooncake::te {
namespace {

struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

class RedisKeyValueStore : public LeasedKeyValueStore {
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

  Status DeleteIfValue(const std::string& key, const std::string& value) override {
    std::lock_guard lock(mu_);
    owned_.EraseIfValue(key, value);
    static const char kScript[] =
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end";
    auto r = CompareLocked(kScript, {key}, {value}, key,
                           [&](const std::optional<std::string>& current, Commands* run) {
                             if (current == value) run->push_back({"DEL", key});
                             return 0;
                           });
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

  using Commands = std::vector<std::vector<std::string>>;
  /// Given the watched key's current value (nullopt: absent), queues the commands to run and returns the
  /// result to report.
  using Decide = std::function<long long(const std::optional<std::string>& current, Commands* run)>;

  // Whether a refused EVAL means "no scripting here" (rather than a failure of the script itself).
  static bool ScriptingRefused(const Status& st) {
    const std::string& m = st.message();
    return m.find("NOSCRIPT") != std::string::npos || m.find("NOPERM") != std::string::npos ||
           m.find("unknown command") != std::string::npos || m.find("disabled") != std::string::npos;
  }

  // A compare-and-act on one key: `script` (KEYS, ARGV; returns an integer) with EVAL, or the same as an
  // optimistic transaction where scripting is refused: WATCH `watch`, GET it, `decide`, MULTI/EXEC (retried
  // when the watched key changed in between).
  StatusOr<long long> CompareLocked(const char* script, const std::vector<std::string>& keys,
                                    const std::vector<std::string>& args, const std::string& watch,
                                    const Decide& decide) {
    if (scripting_) {
      std::vector<std::string> cmd = {"EVAL", script, std::to_string(keys.size())};
      cmd.insert(cmd.end(), keys.begin(), keys.end());
      cmd.insert(cmd.end(), args.begin(), args.end());
      auto r = CommandLocked(cmd);
      if (r.ok()) return (*r)->type == REDIS_REPLY_INTEGER ? (*r)->integer : 0;
      if (!ScriptingRefused(r.status())) return r.status();
      MC_LOG(kWarning) << "redis at " << addr_.ToString() << " refuses scripts (" << r.status().message()
                       << "); using WATCH/MULTI transactions instead";
      scripting_ = false;
    }
    for (int attempt = 0; attempt < 8; ++attempt) {
      auto w = CommandLocked({"WATCH", watch});
      if (!w.ok()) return w.status();
      auto got = RawLocked({"GET", watch});
      if (!got.ok()) return got.status();
      std::optional<std::string> current;
      if ((*got)->type == REDIS_REPLY_STRING) current = std::string((*got)->str, (*got)->len);
      Commands run;
      long long result = decide(current, &run);
      if (run.empty()) {
        auto u = RawLocked({"UNWATCH"});
        if (!u.ok()) return u.status();
        return result;
      }
      auto m = RawLocked({"MULTI"});
      if (!m.ok()) return m.status();
      for (const auto& c : run) {
        auto q = RawLocked(c);
        if (!q.ok()) {
          (void)RawLocked({"DISCARD"});
          return q.status();
        }
      }
      auto e = RawLocked({"EXEC"});
      if (!e.ok()) return e.status();
      if ((*e)->type != REDIS_REPLY_NIL) return result;  // nil: the watched key changed; again
    }
    return Status(ErrorCode::kMetadata, "redis: '" + watch + "' kept changing during a compare-and-set");
  }

  // SET `key` with our TTL only while `guard` holds `guard_value`. Whether it was written.
  StatusOr<bool> PutIfValueLocked(const std::string& key, const std::string& value, const std::string& guard,
                                  const std::string& guard_value) override {
    static const char kScript[] =
        "if redis.call('GET', KEYS[2]) == ARGV[2] then redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[3]) "
        "return 1 end return 0";
    std::string ttl = std::to_string(ttl_.count());
    auto r = CompareLocked(kScript, {key, guard}, {value, guard_value, ttl}, guard,
                           [&](const std::optional<std::string>& current, Commands* run) {
                             if (current != guard_value) return 0;
                             run->push_back({"SET", key, value, "EX", ttl});
                             return 1;
                           });
    if (!r.ok()) return r.status();
    return *r == 1;
  }

  // SET with our TTL (NX: only when absent). Whether it was written.
  Status PutLocked(const std::string& key, const std::string& value) override {
    return SetLocked(key, value, /*only_if_absent=*/false).status();
  }

  StatusOr<bool> CreateLocked(const std::string& key, const std::string& value) override {
    return SetLocked(key, value, /*only_if_absent=*/true);
  }

  StatusOr<bool> SetLocked(const std::string& key, const std::string& value, bool only_if_absent) {
    std::vector<std::string> args = {"SET", key, value, "EX", std::to_string(ttl_.count())};
    if (only_if_absent) args.push_back("NX");
    auto r = CommandLocked(args);
    if (!r.ok()) return r.status();
    return (*r)->type != REDIS_REPLY_NIL;
  }

  // Extends the TTL of each key that still holds our value; writes back one Redis lost (expired, Redis
  // restarted) unless another engine created it meanwhile, and then lets it go with the keys it guards.
  // Claims (guards) first; a guarded key only while its guard is still ours.
  void Refresh() {
    static const char kScript[] =
        "local v = redis.call('GET', KEYS[1]) "
        "if v == ARGV[1] then return redis.call('EXPIRE', KEYS[1], ARGV[2]) elseif v then return -1 end "
        "return 0";
    std::lock_guard lock(mu_);
    std::string ttl = std::to_string(ttl_.count());
    for (const std::string& key : owned_.GuardsFirst()) {
      const OwnedKeys::Entry* e = owned_.Find(key);
      if (!e) continue;  // dropped with its guard
      const std::string value = e->value;
      const std::string guard = e->guard;
      auto r = CompareLocked(kScript, {key}, {value, ttl}, key,
                             [&](const std::optional<std::string>& current, Commands* run) {
                               if (!current) return 0;
                               if (*current != value) return -1;
                               run->push_back({"EXPIRE", key, ttl});
                               return 1;
                             });
      if (r.ok() && *r == 1) continue;
      StatusOr<bool> written = false;
      if (r.ok() && *r == 0) {  // lost: write it back
        if (guard.empty()) {
          written = SetLocked(key, value, /*only_if_absent=*/true);
        } else if (const std::string* gv = owned_.GuardValue(key)) {
          written = PutIfValueLocked(key, value, guard, *gv);
        }
      }
      Status st = !r.ok() ? r.status() : written.status();
      if (!st.ok()) {
        MC_LOG(kWarning) << "redis: keeping '" << key << "' alive failed: " << st.message();
        continue;
      }
      if (!*written) {
        MC_LOG(kError) << "redis: '" << key << "' was taken by another engine while ours had expired; "
                       << "not publishing it (nor what it guards) again";
        owned_.Drop(key);
      }
    }
  }

  net::HostPort addr_;
  std::chrono::seconds ttl_;
  redisContext* ctx_ = nullptr;  // ctx_ and scripting_: guarded by mu_ (the base's)
  bool scripting_ = true;  // false once the server refused EVAL
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
