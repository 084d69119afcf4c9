#include "transfer_engine/common/log.h"

#include <cstdio>

#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>

namespace mooncake::te {
namespace {

LogLevel ParseLevel(const char* s) {
  if (s == nullptr) return LogLevel::kInfo;
  std::string v(s);
  for (auto& c : v) c = static_cast<char>(toupper(c));
  if (v == "TRACE") return LogLevel::kTrace;
  if (v == "DEBUG") return LogLevel::kDebug;
  if (v == "WARNING" || v == "WARN") return LogLevel::kWarning;
  if (v == "ERROR") return LogLevel::kError;
  if (v == "OFF" || v == "NONE") return LogLevel::kOff;
  return LogLevel::kInfo;
}

std::atomic<int>& Level() {
  static std::atomic<int> level{static_cast<int>(ParseLevel(getenv("MC_LOG_LEVEL")))};
  return level;
}

const char kLevelChar[] = "TDIWE";

}  // namespace

LogLevel CurrentLogLevel() { return static_cast<LogLevel>(Level().load(std::memory_order_relaxed)); }
void SetLogLevel(LogLevel level) { Level().store(static_cast<int>(level)); }

LogMessage::LogMessage(LogLevel level, const char* file, int line) {
  timeval tv;
  gettimeofday(&tv, nullptr);
  tm t;
  localtime_r(&tv.tv_sec, &t);
  char ts[32];
  size_t n = strftime(ts, sizeof(ts), "%m%d %H:%M:%S", &t);
  snprintf(ts + n, sizeof(ts) - n, ".%03d", static_cast<int>(tv.tv_usec / 1000));
  const char* base = strrchr(file, '/');
  stream_ << kLevelChar[static_cast<int>(level)] << ts << ' ' << getpid() << ' ' << (base ? base + 1 : file) << ':'
          << line << "] mooncake: ";
}

LogMessage::~LogMessage() {
  stream_ << '\n';
  std::string s = stream_.str();
  ssize_t unused = write(STDERR_FILENO, s.data(), s.size());
  (void)unused;
}

}  // namespace mooncake::te
