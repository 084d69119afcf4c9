// conformance_peer: the target engine of the conformance suite's two-process mode (target.h).
//
// Creates an engine from its flags, registers one buffer, prints
//   ready {"segment": <segment name>, "addr": <buffer address>, "length": <bytes>}
// and then answers one command per line on stdin, one line each on stdout:
//   fill <offset> <length> <seed>           pattern `seed` into the buffer (registered or not)
//   digest <offset> <length>                -> {"digest": <FNV-1a 64>}
//   unregister                              unregisters the buffer (the memory stays)
//   register_extra <length>                 registers more memory -> {"addr": ...}
//   wait_notification <ms> <offset> <length>  -> {"name", "message", "digest" of the range once it arrived}
//   stats                                   -> the engine's StatsJson()
//   exit                                    answers, then stops the engine and exits 0
// Answers are "ok <json>" or "error <code> <message>" (code: the engine's negative ErrorCode). It exits when
// stdin closes or its parent dies. Logs go to stderr.
//
// Flags: --local_server_name= --metadata= --protocol= --transports=a,b --option=<transport>.<key>=<value>
// --device_filter= --buffer_size= --buffer_file= --buffer_file_offset= (map the buffer from that file, MAP_SHARED)
// --fault_transport=<name>=<wrapped> (repeatable) --other_host (run the engine
// in a new PID namespace: another host_id, so transports see another host).

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "transfer_engine/api/engine.h"
#include "transfer_engine/transport/conformance/pattern.h"
#include "transfer_engine/transport/testing/fault_transport.h"

namespace mooncake::te::conformance {
namespace {

void Say(const std::string& line) {
  std::string out = line + "\n";
  for (size_t sent = 0; sent < out.size();) {
    ssize_t n = write(1, out.data() + sent, out.size() - sent);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) _exit(1);  // the parent is gone
    sent += static_cast<size_t>(n);
  }
}

void SayOk(const nlohmann::json& j = nlohmann::json::object()) { Say("ok " + j.dump()); }

void SayError(const Status& st) {
  int code = st.ok() ? static_cast<int>(ErrorCode::kInvalidArgument) : st.raw_code();
  std::string message = st.message();
  for (char& c : message) {
    if (c == '\n') c = ' ';
  }
  Say("error " + std::to_string(code) + " " + message);
}

// Closes every descriptor but stdin, stdout and stderr (the test process's sockets must not live on here).
void CloseInheritedDescriptors() {
#ifdef SYS_close_range
  if (syscall(SYS_close_range, 3u, ~0u, 0u) == 0) return;
#endif
  long max = sysconf(_SC_OPEN_MAX);
  for (long fd = 3; fd < (max > 0 ? max : 1024); ++fd) close(static_cast<int>(fd));
}

// Dies with the parent; false when it is already gone.
bool TieToParent(pid_t parent) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  return getppid() == parent;
}

struct Flags {
  EngineOptions engine;
  size_t buffer_size = 16 << 20;
  std::vector<std::pair<std::string, std::string>> faults;
  bool other_host = false;
  std::string buffer_file;  // the buffer maps this file MAP_SHARED at buffer_file_offset instead
  unsigned long long buffer_file_offset = 0;
};

Status ParseFlags(int argc, char** argv, Flags* f) {
  f->engine.protocol = "";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](const char* name, std::string* out) {
      std::string prefix = std::string("--") + name + "=";
      if (a.compare(0, prefix.size(), prefix) != 0) return false;
      *out = a.substr(prefix.size());
      return true;
    };
    std::string v;
    if (value("local_server_name", &v)) {
      f->engine.local_server_name = v;
    } else if (value("metadata", &v)) {
      f->engine.metadata_conn = v;
    } else if (value("protocol", &v)) {
      f->engine.protocol = v;
    } else if (value("transports", &v)) {
      std::stringstream ss(v);
      for (std::string t; std::getline(ss, t, ',');) {
        if (!t.empty()) f->engine.transports.push_back(t);
      }
    } else if (value("option", &v)) {
      size_t eq = v.find('=');
      if (eq == std::string::npos || eq == 0) return InvalidArgument("--option needs <key>=<value>, got '" + v + "'");
      f->engine.transport_options[v.substr(0, eq)] = v.substr(eq + 1);
    } else if (value("device_filter", &v)) {
      f->engine.device_filter = v;
    } else if (value("buffer_size", &v)) {
      char* end = nullptr;
      unsigned long long n = std::strtoull(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || n == 0 || n > (1ull << 34)) {
        return InvalidArgument("--buffer_size must be in [1, 16 GiB], got '" + v + "'");
      }
      f->buffer_size = static_cast<size_t>(n);
    } else if (value("fault_transport", &v)) {
      size_t eq = v.find('=');
      if (eq == std::string::npos || eq == 0 || eq + 1 == v.size()) {
        return InvalidArgument("--fault_transport needs <name>=<wrapped transport>, got '" + v + "'");
      }
      f->faults.emplace_back(v.substr(0, eq), v.substr(eq + 1));
    } else if (value("buffer_file", &v)) {
      f->buffer_file = v;
    } else if (value("buffer_file_offset", &v)) {
      char* end = nullptr;
      f->buffer_file_offset = std::strtoull(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0') return InvalidArgument("--buffer_file_offset needs a number, got '" + v + "'");
    } else if (a == "--other_host") {
      f->other_host = true;
    } else {
      return InvalidArgument("unknown flag '" + a + "'");
    }
  }
  if (f->engine.local_server_name.empty()) f->engine.local_server_name = "127.0.0.1";
  return Status::Ok();
}

// Runs the engine in a new PID namespace: this process stays outside as its waiter (and says the engine
// process's pid), the child continues. Returns only in the child.
Status EnterOtherHost() {
  if (unshare(CLONE_NEWPID) != 0) {
    return Status(ErrorCode::kNotImplemented, std::string("cannot emulate another host: unshare(CLONE_NEWPID): ") +
                                                  strerror(errno));
  }
  int go[2];
  if (pipe(go) != 0) return Status(ErrorCode::kMemory, std::string("pipe: ") + strerror(errno));
  pid_t child = fork();
  if (child < 0) return Status(ErrorCode::kMemory, std::string("fork: ") + strerror(errno));
  if (child == 0) {
    // The first process of the new namespace: getppid() says 0 here, so the go byte tells that the waiter lives.
    close(go[1]);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    char c;
    ssize_t n;
    while ((n = read(go[0], &c, 1)) < 0 && errno == EINTR) {
    }
    close(go[0]);
    if (n != 1) _exit(1);
    return Status::Ok();
  }
  close(go[0]);
  Say("spawned " + nlohmann::json{{"pid", child}}.dump());  // before the child can say "ready"
  while (write(go[1], "g", 1) < 0 && errno == EINTR) {
  }
  close(go[1]);
  int status = 0;
  while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  _exit(WIFEXITED(status) ? WEXITSTATUS(status) : 1);
}

class Peer {
 public:
  Peer(std::unique_ptr<TransferEngine> engine, uint8_t* buffer, size_t size)
      : engine_(std::move(engine)), buffer_(buffer), size_(size) {}

  ~Peer() {
    engine_.reset();  // before the memory it registered
    for (auto& [p, n] : extras_) munmap(p, n);
  }

  // Answers one command line; false on "exit".
  bool Handle(const std::string& line) {
    std::istringstream in(line);
    std::string cmd;
    in >> cmd;
    auto range = [&](size_t* off, size_t* len) {
      unsigned long long o, l;
      if (!(in >> o >> l) || o > size_ || l > size_ - o) {
        SayError(InvalidArgument("'" + line + "': needs <offset> <length> inside the buffer of " +
                                 std::to_string(size_) + " bytes"));
        return false;
      }
      *off = static_cast<size_t>(o);
      *len = static_cast<size_t>(l);
      return true;
    };
    size_t off = 0, len = 0;
    if (cmd == "fill") {
      unsigned long long seed;
      if (!range(&off, &len)) return true;
      if (!(in >> seed)) {
        SayError(InvalidArgument("fill needs <offset> <length> <seed>"));
        return true;
      }
      FillPattern(buffer_ + off, len, seed, off);
      SayOk();
    } else if (cmd == "digest") {
      if (range(&off, &len)) SayOk({{"digest", Digest(buffer_ + off, len)}});
    } else if (cmd == "unregister") {
      Status st = engine_->UnregisterMemory(buffer_);
      st.ok() ? SayOk() : SayError(st);
    } else if (cmd == "register_extra") {
      unsigned long long n;
      if (!(in >> n) || n == 0 || n > (1ull << 30)) {
        SayError(InvalidArgument("register_extra needs a length in [1, 1 GiB]"));
        return true;
      }
      void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) {
        SayError(Status(ErrorCode::kMemory, std::string("mmap: ") + strerror(errno)));
        return true;
      }
      extras_.emplace_back(p, n);
      Status st = engine_->RegisterMemory(p, n);
      st.ok() ? SayOk({{"addr", reinterpret_cast<uint64_t>(p)}}) : SayError(st);
    } else if (cmd == "wait_notification") {
      unsigned long long ms;
      if (!(in >> ms) || ms > 600000) {
        SayError(InvalidArgument("wait_notification needs <ms> (at most 600000) <offset> <length>"));
        return true;
      }
      if (!range(&off, &len)) return true;
      auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
      while (true) {
        auto got = engine_->TakeNotifications();
        if (!got.empty()) {
          SayOk({{"name", got.front().name}, {"message", got.front().message}, {"digest", Digest(buffer_ + off, len)}});
          break;
        }
        if (std::chrono::steady_clock::now() >= deadline) {
          SayError(Status(ErrorCode::kTimeout, "no notification arrived within " + std::to_string(ms) + " ms"));
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
    } else if (cmd == "stats") {
      Say("ok " + engine_->StatsJson());
    } else if (cmd == "exit") {
      SayOk();
      return false;
    } else {
      SayError(InvalidArgument("unknown command '" + cmd + "'"));
    }
    return true;
  }

 private:
  std::unique_ptr<TransferEngine> engine_;
  uint8_t* buffer_;
  size_t size_;
  std::vector<std::pair<void*, size_t>> extras_;
};

int Main(int argc, char** argv) {
  pid_t parent = getppid();
  if (!TieToParent(parent)) return 1;
  CloseInheritedDescriptors();
  Flags flags;
  Status st = ParseFlags(argc, argv, &flags);
  if (!st.ok()) {
    SayError(st);
    return 2;
  }
  if (flags.other_host) {
    st = EnterOtherHost();
    if (!st.ok()) {
      SayError(st);
      return 3;
    }
  }
  for (const auto& [name, inner] : flags.faults) {
    auto c = testing::RegisterFaultTransport(name, inner);
    if (!c.ok()) {
      SayError(c.status());
      return 2;
    }
  }
  auto engine = TransferEngine::Create(flags.engine);
  if (!engine.ok()) {
    SayError(engine.status());
    return 1;
  }
  void* mem = MAP_FAILED;
  if (flags.buffer_file.empty()) {
    mem = mmap(nullptr, flags.buffer_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  } else if (int fd = open(flags.buffer_file.c_str(), O_RDWR | O_CLOEXEC); fd >= 0) {
    mem = mmap(nullptr, flags.buffer_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
               static_cast<off_t>(flags.buffer_file_offset));
    close(fd);
  }
  if (mem == MAP_FAILED) {
    SayError(Status(ErrorCode::kMemory, std::string("mmap: ") + strerror(errno)));
    return 1;
  }
  auto* buffer = static_cast<uint8_t*>(mem);
  st = (*engine)->RegisterMemory(buffer, flags.buffer_size);
  if (!st.ok()) {
    SayError(st);
    return 1;
  }
  std::string segment = (*engine)->segment_name();
  {
    Peer peer(std::move(engine.value()), buffer, flags.buffer_size);
    Say("ready " + nlohmann::json{{"segment", segment},
                                  {"addr", reinterpret_cast<uint64_t>(buffer)},
                                  {"length", flags.buffer_size}}
                       .dump());
    for (std::string line; std::getline(std::cin, line);) {
      if (!peer.Handle(line)) break;
    }
  }
  munmap(mem, flags.buffer_size);
  return 0;
}

}  // namespace
}  // namespace mooncake::te::conformance

int main(int argc, char** argv) { return mooncake::te::conformance::Main(argc, argv); }
