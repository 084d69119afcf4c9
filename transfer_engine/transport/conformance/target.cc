#include "transfer_engine/transport/conformance/target.h"

#include <dirent.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>

#include <nlohmann/json.hpp>

#include "transfer_engine/transport/conformance/pattern.h"

extern char** environ;

namespace mooncake::te::conformance {
namespace {

using Clock = std::chrono::steady_clock;

Status RangeError(size_t offset, size_t length, size_t size) {
  return InvalidArgument("range [" + std::to_string(offset) + ", +" + std::to_string(length) +
                         ") is outside the target's buffer of " + std::to_string(size) + " bytes");
}

bool InRange(size_t offset, size_t length, size_t size) { return offset <= size && length <= size - offset; }

// A MAP_SHARED mapping of part of a file (TargetOptions::buffer_file), unmapped on destruction.
struct FileMapping {
  void* addr = nullptr;
  size_t length = 0;
  Status Map(const std::string& path, uint64_t offset, size_t len) {
    int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) return InvalidArgument("open " + path + ": " + strerror(errno));
    void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, static_cast<off_t>(offset));
    close(fd);
    if (p == MAP_FAILED) return Status(ErrorCode::kMemory, "mmap " + path + ": " + strerror(errno));
    addr = p;
    length = len;
    return Status::Ok();
  }
  ~FileMapping() {
    if (addr) munmap(addr, length);
  }
};

// ---------------------------------------------------------------------------------------------------------
// In this process

class InProcessTarget : public Target {
 public:
  static StatusOr<std::unique_ptr<Target>> Start(const TargetOptions& options) {
    std::unique_ptr<InProcessTarget> t(new InProcessTarget());
    if (options.buffer_file.empty()) {
      t->buffer_.assign(options.buffer_size, 0);
      t->data_ = t->buffer_.data();
    } else {
      MC_RETURN_IF_ERROR(t->file_.Map(options.buffer_file, options.buffer_file_offset, options.buffer_size));
      t->data_ = static_cast<uint8_t*>(t->file_.addr);
    }
    t->size_ = options.buffer_size;
    auto engine = TransferEngine::Create(options.engine);
    if (!engine.ok()) return engine.status();
    t->engine_ = std::move(engine.value());
    MC_RETURN_IF_ERROR(t->engine_->RegisterMemory(t->data_, t->size_));
    return std::unique_ptr<Target>(std::move(t));
  }

  const std::string& segment_name() const override { return name_cache(); }
  uint64_t buffer_address() const override { return reinterpret_cast<uint64_t>(data_); }
  size_t buffer_size() const override { return size_; }
  std::string where() const override { return "in-process"; }

  Status Fill(size_t offset, size_t length, uint64_t seed) override {
    if (!InRange(offset, length, size_)) return RangeError(offset, length, size_);
    FillPattern(data_ + offset, length, seed, offset);
    return Status::Ok();
  }
  StatusOr<uint64_t> DigestOf(size_t offset, size_t length) override {
    if (!InRange(offset, length, size_)) return RangeError(offset, length, size_);
    return Digest(data_ + offset, length);
  }
  Status Unregister() override {
    MC_RETURN_IF_ERROR(Alive());
    return engine_->UnregisterMemory(data_);
  }
  StatusOr<uint64_t> RegisterExtra(size_t length) override {
    MC_RETURN_IF_ERROR(Alive());
    extras_.emplace_back(length, 0);
    MC_RETURN_IF_ERROR(engine_->RegisterMemory(extras_.back().data(), length));
    return reinterpret_cast<uint64_t>(extras_.back().data());
  }
  StatusOr<Notified> WaitNotification(std::chrono::milliseconds timeout, size_t offset, size_t length) override {
    MC_RETURN_IF_ERROR(Alive());
    if (!InRange(offset, length, size_)) return RangeError(offset, length, size_);
    auto deadline = Clock::now() + timeout;
    while (true) {
      auto got = engine_->TakeNotifications();
      if (!got.empty()) return Notified{got.front(), Digest(data_ + offset, length)};
      if (Clock::now() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return Status(ErrorCode::kTimeout, "no notification arrived within " + std::to_string(timeout.count()) + " ms");
  }
  StatusOr<std::string> Stats() override {
    MC_RETURN_IF_ERROR(Alive());
    return engine_->StatsJson();
  }
  void Vanish() override {
    if (engine_) name_ = engine_->segment_name();
    engine_.reset();
  }

 private:
  InProcessTarget() = default;
  const std::string& name_cache() const { return engine_ ? engine_->segment_name() : name_; }
  Status Alive() const {
    return engine_ ? Status::Ok() : Status(ErrorCode::kPeerUnreachable, "the in-process target was destroyed");
  }

  // Declared before the engine: the memory it registered outlives it.
  std::vector<uint8_t> buffer_;
  FileMapping file_;  // instead of buffer_ with TargetOptions::buffer_file
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::vector<std::vector<uint8_t>> extras_;
  std::string name_;  // after Vanish
  std::unique_ptr<TransferEngine> engine_;
};

// ---------------------------------------------------------------------------------------------------------
// In a child process

class PeerProcessTarget : public Target {
 public:
  ~PeerProcessTarget() override {
    if (pid_ <= 0) return;
    // A polite exit first (the child unpublishes and stops its engine), then force.
    auto reply = Call("exit", std::chrono::seconds(5));
    if (reply.ok() && WaitExit(std::chrono::seconds(5))) {
      CloseChannel();
      return;
    }
    Kill();
  }

  static StatusOr<std::unique_ptr<Target>> Start(const TargetOptions& options, std::chrono::milliseconds timeout) {
    auto path = PeerBinaryPath();
    if (!path.ok()) return path.status();
    std::unique_ptr<PeerProcessTarget> t(new PeerProcessTarget());
    MC_RETURN_IF_ERROR(t->Spawn(*path, PeerArguments(options)));
    auto deadline = Clock::now() + timeout;
    while (true) {
      auto line = t->ReadLine(deadline);
      if (!line.ok()) {
        t->Kill();
        return Status(line.status().code(), "conformance_peer did not report ready: " + line.status().message());
      }
      auto [word, j] = Split(*line);
      if (word == "spawned") {  // the PID-namespace helper's child: the process that runs the engine
        t->engine_pid_ = j.value("pid", 0);
        continue;
      }
      if (word == "error") {
        t->Kill();
        return ChildError(*line);
      }
      if (word != "ready" || !j.is_object()) {
        t->Kill();
        return Status(ErrorCode::kRejectHandshake, "conformance_peer said '" + *line + "' instead of ready");
      }
      t->segment_ = j.value("segment", "");
      t->addr_ = j.value("addr", uint64_t{0});
      t->size_ = j.value("length", size_t{0});
      return std::unique_ptr<Target>(std::move(t));
    }
  }

  const std::string& segment_name() const override { return segment_; }
  uint64_t buffer_address() const override { return addr_; }
  size_t buffer_size() const override { return size_; }
  std::string where() const override { return "child process " + std::to_string(pid_); }

  Status Fill(size_t offset, size_t length, uint64_t seed) override {
    return Call("fill " + std::to_string(offset) + " " + std::to_string(length) + " " + std::to_string(seed))
        .status();
  }
  StatusOr<uint64_t> DigestOf(size_t offset, size_t length) override {
    auto j = Call("digest " + std::to_string(offset) + " " + std::to_string(length));
    if (!j.ok()) return j.status();
    return j->value("digest", uint64_t{0});
  }
  Status Unregister() override { return Call("unregister").status(); }
  StatusOr<uint64_t> RegisterExtra(size_t length) override {
    auto j = Call("register_extra " + std::to_string(length));
    if (!j.ok()) return j.status();
    return j->value("addr", uint64_t{0});
  }
  StatusOr<Notified> WaitNotification(std::chrono::milliseconds timeout, size_t offset, size_t length) override {
    auto j = Call("wait_notification " + std::to_string(timeout.count()) + " " + std::to_string(offset) + " " +
                      std::to_string(length),
                  timeout + kCallTimeout);
    if (!j.ok()) return j.status();
    return Notified{{j->value("name", ""), j->value("message", "")}, j->value("digest", uint64_t{0})};
  }
  StatusOr<std::string> Stats() override {
    auto j = Call("stats");
    if (!j.ok()) return j.status();
    return j->dump();
  }
  void Vanish() override { Kill(); }

 private:
  static constexpr std::chrono::milliseconds kCallTimeout{10000};

  PeerProcessTarget() = default;

  static std::pair<std::string, nlohmann::json> Split(const std::string& line) {
    size_t sp = line.find(' ');
    std::string word = line.substr(0, sp);
    nlohmann::json j = sp == std::string::npos ? nlohmann::json::object()
                                               : nlohmann::json::parse(line.substr(sp + 1), nullptr, false);
    return {word, j};
  }

  // "error <code> <message>" from the child.
  static Status ChildError(const std::string& line) {
    char* end = nullptr;
    const char* p = line.c_str() + 6;
    long code = std::strtol(p, &end, 10);
    std::string message = end && *end == ' ' ? std::string(end + 1) : line;
    if (code >= 0 || end == p) code = static_cast<long>(ErrorCode::kInvalidArgument);
    return Status(static_cast<ErrorCode>(code), "conformance_peer: " + message);
  }

  Status Spawn(const std::string& path, const std::vector<std::string>& args) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
      return Status(ErrorCode::kSocket, std::string("socketpair: ") + strerror(errno));
    }
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, sv[1], 0);
    posix_spawn_file_actions_adddup2(&actions, sv[1], 1);
    std::vector<std::string> argv_store{path};
    argv_store.insert(argv_store.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : argv_store) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = 0;
    int rc = posix_spawn(&pid, path.c_str(), &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    close(sv[1]);
    if (rc != 0) {
      close(sv[0]);
      return Status(ErrorCode::kInvalidArgument, "posix_spawn " + path + ": " + strerror(rc));
    }
    pid_ = pid;
    fd_ = sv[0];
    return Status::Ok();
  }

  // One line from the child (without its newline), waiting until `deadline`.
  StatusOr<std::string> ReadLine(Clock::time_point deadline) {
    while (true) {
      size_t nl = input_.find('\n');
      if (nl != std::string::npos) {
        std::string line = input_.substr(0, nl);
        input_.erase(0, nl + 1);
        return line;
      }
      if (fd_ < 0) return Status(ErrorCode::kPeerUnreachable, "the child process is gone");
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) return Status(ErrorCode::kTimeout, "no answer in time");
      pollfd p{fd_, POLLIN, 0};
      int n = poll(&p, 1, static_cast<int>(std::min<long long>(left, 1000)));
      if (n < 0 && errno != EINTR) return Status(ErrorCode::kSocket, std::string("poll: ") + strerror(errno));
      if (n <= 0) continue;
      char buf[4096];
      ssize_t got = read(fd_, buf, sizeof(buf));
      if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (got <= 0) return Status(ErrorCode::kPeerUnreachable, "the child process closed its output (exited?)");
      input_.append(buf, static_cast<size_t>(got));
    }
  }

  // Sends one command and returns the JSON of its "ok" answer; a child that does not answer in time is killed.
  StatusOr<nlohmann::json> Call(const std::string& command, std::chrono::milliseconds timeout = kCallTimeout) {
    if (fd_ < 0) return Status(ErrorCode::kPeerUnreachable, "conformance_peer is gone (it was killed or exited)");
    std::string out = command + "\n";
    for (size_t sent = 0; sent < out.size();) {
      ssize_t n = send(fd_, out.data() + sent, out.size() - sent, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        std::string why = strerror(errno);
        Kill();
        return Status(ErrorCode::kPeerUnreachable, "conformance_peer: sending '" + command + "' failed: " + why);
      }
      sent += static_cast<size_t>(n);
    }
    auto line = ReadLine(Clock::now() + timeout);
    if (!line.ok()) {
      Kill();
      return Status(line.status().code(), "conformance_peer (pid " + std::to_string(pid_) + ") on '" + command +
                                              "': " + line.status().message() + "; killed it");
    }
    auto [word, j] = Split(*line);
    if (word == "ok") return j.is_discarded() ? nlohmann::json::object() : j;
    if (word == "error") return ChildError(*line);
    Kill();
    return Status(ErrorCode::kRejectHandshake, "conformance_peer answered '" + command + "' with '" + *line + "'");
  }

  // Reaps the child if it exits before `timeout`.
  bool WaitExit(std::chrono::milliseconds timeout) {
    auto deadline = Clock::now() + timeout;
    while (pid_ > 0) {
      int status = 0;
      pid_t r = waitpid(pid_, &status, WNOHANG);
      if (r == pid_ || (r < 0 && errno == ECHILD)) {
        pid_ = -1;
        return true;
      }
      if (Clock::now() >= deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return true;
  }

  void CloseChannel() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

  void Kill() {
    if (engine_pid_ > 0) kill(engine_pid_, SIGKILL);
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      int status = 0;
      while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
      }
      pid_ = -1;
    }
    engine_pid_ = -1;
    CloseChannel();
  }

  pid_t pid_ = -1;
  pid_t engine_pid_ = -1;  // with other_host: the grandchild that runs the engine
  int fd_ = -1;
  std::string input_;
  std::string segment_;
  uint64_t addr_ = 0;
  size_t size_ = 0;
};

bool IsExecutable(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(path.c_str(), X_OK) == 0;
}

}  // namespace

const char* PeerModeName(PeerMode mode) { return mode == PeerMode::kInProcess ? "InProcess" : "TwoProcess"; }

StatusOr<std::unique_ptr<Target>> StartInProcessTarget(const TargetOptions& options) {
  return InProcessTarget::Start(options);
}

StatusOr<std::unique_ptr<Target>> StartPeerProcessTarget(const TargetOptions& options,
                                                         std::chrono::milliseconds ready_timeout) {
  return PeerProcessTarget::Start(options, ready_timeout);
}

StatusOr<std::string> PeerBinaryPath() {
  const std::string rel = "transfer_engine/transport/conformance/conformance_peer";
  std::vector<std::string> tried;
  if (const char* p = getenv("MC_CONFORMANCE_PEER"); p && *p) tried.push_back(p);
  const char* srcdir = getenv("TEST_SRCDIR");
  const char* workspace = getenv("TEST_WORKSPACE");
  if (srcdir && *srcdir && workspace && *workspace) tried.push_back(std::string(srcdir) + "/" + workspace + "/" + rel);
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n > 0) {
    std::string runfiles = std::string(self, static_cast<size_t>(n)) + ".runfiles";
    if (DIR* d = opendir(runfiles.c_str())) {
      while (dirent* e = readdir(d)) {
        if (e->d_name[0] != '.') tried.push_back(runfiles + "/" + e->d_name + "/" + rel);
      }
      closedir(d);
    }
  }
  for (const auto& p : tried) {
    if (IsExecutable(p)) return p;
  }
  std::string all;
  for (const auto& p : tried) all += (all.empty() ? "" : ", ") + p;
  return NotFound("conformance_peer not found (tried: " + (all.empty() ? std::string("nothing") : all) +
                  "); add //transfer_engine/transport/conformance:conformance_peer to the test's data or set "
                  "MC_CONFORMANCE_PEER");
}

std::vector<std::string> PeerArguments(const TargetOptions& options) {
  const EngineOptions& e = options.engine;
  std::string transports;
  for (const auto& t : e.transports) transports += (transports.empty() ? "" : ",") + t;
  std::vector<std::string> args{
      "--local_server_name=" + e.local_server_name, "--metadata=" + e.metadata_conn, "--protocol=" + e.protocol,
      "--transports=" + transports,                 "--device_filter=" + e.device_filter,
      "--buffer_size=" + std::to_string(options.buffer_size),
  };
  for (const auto& [k, v] : e.transport_options) args.push_back("--option=" + k + "=" + v);
  for (const auto& [name, inner] : options.fault_transports) args.push_back("--fault_transport=" + name + "=" + inner);
  if (options.other_host) args.push_back("--other_host");
  if (!options.buffer_file.empty()) {
    args.push_back("--buffer_file=" + options.buffer_file);
    args.push_back("--buffer_file_offset=" + std::to_string(options.buffer_file_offset));
  }
  return args;
}

}  // namespace mooncake::te::conformance
