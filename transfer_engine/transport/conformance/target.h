#ifndef MOONCAKE_TRANSFER_ENGINE_TRANSPORT_CONFORMANCE_TARGET_H_
#define MOONCAKE_TRANSFER_ENGINE_TRANSPORT_CONFORMANCE_TARGET_H_

// The far end of the conformance suite's transfers: an engine with one registered buffer, either in this process
// or in a child process (conformance_peer) driven over a socket pair on its stdin/stdout.

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "transfer_engine/api/engine.h"

namespace mooncake::te::conformance {

/// Where the target engine runs.
enum class PeerMode { kInProcess, kTwoProcess };
const char* PeerModeName(PeerMode mode);  ///< "InProcess", "TwoProcess"

/// How a target's engine is made.
struct TargetOptions {
  /// The target engine's options. A child process gets local_server_name, metadata_conn, protocol, transports,
  /// transport_options and device_filter on its command line; `config` comes from the environment it inherits.
  EngineOptions engine;
  size_t buffer_size = 16 << 20;
  /// When not empty, the buffer is a MAP_SHARED mapping of this existing file at `buffer_file_offset` (a device
  /// or file the transport maps too, e.g. cxl) instead of anonymous memory.
  std::string buffer_file;
  uint64_t buffer_file_offset = 0;
  /// Fault transports (name, wrapped transport) the child registers before creating its engine, so a transport
  /// list naming them means the same there (testing/fault_transport.h).
  std::vector<std::pair<std::string, std::string>> fault_transports;
  /// Child process only: run the engine in a new PID namespace, so its host_id differs from this process's and
  /// transports treat it as an engine of another host (needs CAP_SYS_ADMIN; Start fails with kNotImplemented
  /// and the reason without it).
  bool other_host = false;
};

/// An engine the suite moves bytes to and from, with one registered buffer of TargetOptions::buffer_size bytes.
/// Every call is bounded in time (seconds) and reports failure as a Status; a child process that fails to answer
/// in time is killed. Not thread-safe: one caller at a time.
class Target {
 public:
  virtual ~Target() = default;

  virtual const std::string& segment_name() const = 0;
  virtual uint64_t buffer_address() const = 0;
  virtual size_t buffer_size() const = 0;
  /// "in-process" or "child process <pid>".
  virtual std::string where() const = 0;

  /// Writes pattern `seed` (pattern.h) into [offset, offset + length) of the buffer, registered or not.
  virtual Status Fill(size_t offset, size_t length, uint64_t seed) = 0;
  /// Digest (pattern.h) of [offset, offset + length) of the buffer.
  virtual StatusOr<uint64_t> DigestOf(size_t offset, size_t length) = 0;
  /// Unregisters the buffer (the memory stays allocated, so Fill and DigestOf still work).
  virtual Status Unregister() = 0;
  /// Registers another `length` bytes (the target's descriptor changes); its address.
  virtual StatusOr<uint64_t> RegisterExtra(size_t length) = 0;

  struct Notified {
    Notification notification;
    uint64_t digest = 0;  ///< of the range asked for, taken right after the notification was seen
  };
  /// Waits up to `timeout` for a notification to arrive; kTimeout when none did.
  virtual StatusOr<Notified> WaitNotification(std::chrono::milliseconds timeout, size_t offset, size_t length) = 0;
  /// The target engine's StatsJson().
  virtual StatusOr<std::string> Stats() = 0;
  /// Makes the engine go away at once: destroyed (in-process) or its process SIGKILLed (and reaped).
  virtual void Vanish() = 0;
};

/// A target in this process.
StatusOr<std::unique_ptr<Target>> StartInProcessTarget(const TargetOptions& options);

/// A target in a child process: the conformance_peer binary (see PeerBinaryPath), spawned with posix_spawn; waits
/// up to `ready_timeout` for it to report its engine ready. The child dies with the thread that started it
/// (PR_SET_PDEATHSIG) and when its stdin closes.
StatusOr<std::unique_ptr<Target>> StartPeerProcessTarget(const TargetOptions& options,
                                                         std::chrono::milliseconds ready_timeout =
                                                             std::chrono::seconds(20));

/// Where conformance_peer is: $MC_CONFORMANCE_PEER, else the test's runfiles ($TEST_SRCDIR/$TEST_WORKSPACE/...,
/// else <this executable>.runfiles/...). kNotFound when none exists.
StatusOr<std::string> PeerBinaryPath();

/// The command line conformance_peer understands for `options` (without the program name).
std::vector<std::string> PeerArguments(const TargetOptions& options);

}  // namespace mooncake::te::conformance

#endif  // MOONCAKE_TRANSFER_ENGINE_TRANSPORT_CONFORMANCE_TARGET_H_
