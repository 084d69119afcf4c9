#ifndef MOONCAKE_TRANSFER_ENGINE_COMMON_LOG_H_
#define MOONCAKE_TRANSFER_ENGINE_COMMON_LOG_H_

#include <sstream>

namespace mooncake::te {

enum class LogLevel : int { kTrace = 0, kDebug = 1, kInfo = 2, kWarning = 3, kError = 4, kOff = 5 };

/// Current threshold: MC_LOG_LEVEL (TRACE, DEBUG, INFO, WARNING, ERROR, OFF; default INFO), read once.
LogLevel CurrentLogLevel();
void SetLogLevel(LogLevel level);

/// One log line, written to stderr in a single write() when destroyed. Thread-safe.
class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  ~LogMessage();
  std::ostream& stream() { return stream_; }

 private:
  std::ostringstream stream_;
};

/// Turns `stream << ...` into void so MC_LOG works as a statement in any if/else.
struct LogVoidify {
  void operator&(std::ostream&) {}
};

}  // namespace mooncake::te

#define MC_LOG_ENABLED(level) \
  (::mooncake::te::LogLevel::level >= ::mooncake::te::CurrentLogLevel())
#define MC_LOG(level)                                \
  !MC_LOG_ENABLED(level) ? (void)0                   \
                         : ::mooncake::te::LogVoidify() & \
                               ::mooncake::te::LogMessage(::mooncake::te::LogLevel::level, __FILE__, __LINE__).stream()

#endif  // MOONCAKE_TRANSFER_ENGINE_COMMON_LOG_H_
