#ifndef MOONCAKE_TRANSFER_ENGINE_COMPAT_COMPAT_ENGINE_H_
#define MOONCAKE_TRANSFER_ENGINE_COMPAT_COMPAT_ENGINE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "transfer_engine/api/engine.h"

namespace mooncake::te {

/// Mooncake's integer-returning engine API (what `mooncake.engine.TransferEngine` exposes), on top of
/// TransferEngine: 0 ok / negative error codes, batch id 0 on submit failure, sync calls bounded by
/// MC_TRANSFER_TIMEOUT plus 1 ns per byte. Failures are logged with their reason (the int alone cannot say).
///
/// Threading: thread-safe after Initialize; Initialize must not race other calls. Blocking calls do not
/// spin. All addresses are raw virtual addresses.
class CompatEngine {
 public:
  CompatEngine() = default;
  ~CompatEngine();

  /// `metadata_server`: "P2PHANDSHAKE", "scheme://..." or a bare etcd address (Mooncake's default).
  int Initialize(const std::string& local_hostname, const std::string& metadata_server, const std::string& protocol,
                 const std::string& device_name);
  int InitializeExt(const std::string& local_hostname, const std::string& metadata_server,
                    const std::string& protocol, const std::string& device_name, const std::string& metadata_type);
  bool initialized() const { return engine_ != nullptr; }
  /// Unpublishes the segment and stops the engine (also done by the destructor). Idempotent.
  void Close() { engine_.reset(); }
  int GetRpcPort() const;
  std::string SegmentName() const;

  uintptr_t AllocateManagedBuffer(size_t length, int device = -1);
  int FreeManagedBuffer(uintptr_t addr, size_t length);

  int RegisterMemory(uintptr_t addr, size_t length, const std::string& location);
  int UnregisterMemory(uintptr_t addr);
  int BatchRegisterMemory(const std::vector<uintptr_t>& addrs, const std::vector<size_t>& lengths,
                          const std::string& location);
  int BatchUnregisterMemory(const std::vector<uintptr_t>& addrs);

  /// opcode: OpCode. A notification, when given, is delivered after the data is in place.
  int TransferSync(const std::string& target, uintptr_t buffer, uint64_t peer_address, size_t length, OpCode op,
                   const std::optional<Notification>& notify);
  int BatchTransferSync(const std::string& target, const std::vector<uintptr_t>& buffers,
                        const std::vector<uint64_t>& peer_addresses, const std::vector<size_t>& lengths, OpCode op,
                        const std::optional<Notification>& notify);
  /// Batch id (> 0), or 0 on failure.
  uint64_t BatchTransferAsync(const std::string& target, const std::vector<uintptr_t>& buffers,
                              const std::vector<uint64_t>& peer_addresses, const std::vector<size_t>& lengths,
                              OpCode op);
  /// Waits for all; 0 when every batch completed, -1 otherwise. The ids are freed either way.
  int GetBatchTransferStatus(const std::vector<uint64_t>& batch_ids);
  /// 1 completed (freed), 0 in progress, -1 failed (freed), -2 timed out (freed).
  int TransferCheckStatus(uint64_t batch_id);

  uintptr_t GetFirstBufferAddress(const std::string& segment_name);
  /// TransferEngine::DefineSegment / UndefineSegment (extras, not in Mooncake's API): 0, else the status's
  /// negative code (-1 bad argument or not initialized).
  int DefineSegment(const std::string& name, const std::string& descriptor_json);
  int UndefineSegment(const std::string& name);
  std::string GetLocalTopology(const std::string& device_name) const;
  std::vector<Notification> GetNotifies();
  /// timeout_ms 0: the handshake timeout (MC_HANDSHAKE_CONNECT_TIMEOUT).
  int SendProbe(const std::string& peer, int timeout_ms = 0);
  int SendNotify(const std::string& peer, const Notification& notify);
  std::string StatsJson() const;

  TransferEngine* engine() const { return engine_.get(); }

 private:
  std::chrono::nanoseconds Budget(size_t bytes) const;
  /// Builds requests; on a bad argument logs and returns false.
  bool BuildRequests(const std::string& target, const std::vector<uintptr_t>& buffers,
                     const std::vector<uint64_t>& peer_addresses, const std::vector<size_t>& lengths, OpCode op,
                     std::vector<TransferRequest>* out, size_t* total);
  int RunSync(const std::string& target, const std::vector<TransferRequest>& requests, size_t total,
              const std::optional<Notification>& notify);

  std::unique_ptr<TransferEngine> engine_;
};

}  // namespace mooncake::te

#endif  // MOONCAKE_TRANSFER_ENGINE_COMPAT_COMPAT_ENGINE_H_
