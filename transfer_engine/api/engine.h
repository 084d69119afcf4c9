#ifndef MOONCAKE_TRANSFER_ENGINE_API_ENGINE_H_
#define MOONCAKE_TRANSFER_ENGINE_API_ENGINE_H_

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "transfer_engine/api/status.h"
#include "transfer_engine/api/types.h"
#include "transfer_engine/common/config.h"

namespace mooncake::te {

struct EngineOptions {
  /// "host" or "host:port". In P2PHANDSHAKE mode the segment name becomes "host:<rpc port>".
  std::string local_server_name;
  /// "P2PHANDSHAKE", "http://host:port/metadata", ... (see CreateMetadataBackend).
  std::string metadata_conn = "P2PHANDSHAKE";
  /// Preferred network protocol, Mooncake's strings ("tcp", "rdma", "efa", "nvlink", "cxl", ...): the
  /// transport serving it is installed and chosen over other network transports. Creation fails with the
  /// plugin's reason when no usable transport serves it (never a silent fallback). Empty: no preference.
  /// Every other usable transport is installed too (unless `transports` says otherwise) and used where it
  /// is the better path (same-host copies) or the only one.
  std::string protocol = "tcp";
  /// When not empty, only these transports (by name) are installed. A transport plugin may also declare an
  /// environment variable that makes it the only one (tcp: MC_FORCE_TCP).
  std::vector<std::string> transports;
  /// Per-transport settings, "<transport>.<key>" -> value (see each transport's README); they override the
  /// transport's MC_* variables.
  std::map<std::string, std::string> transport_options;
  /// Comma-separated NIC allow-list (empty: all).
  std::string device_filter;
  EngineConfig config = EngineConfig::FromEnv();
};

/// Moves bytes between registered memory of this process and any segment (this or another process, this or
/// another host), in batches of asynchronous requests.
///
/// Threading: every method is thread-safe. Waiting methods block without spinning. Memory passed to
/// RegisterMemory must stay valid until UnregisterMemory returns (it waits for transfers using it).
/// Destruction unpublishes this segment, stops all threads and fails transfers still in flight.
class TransferEngine {
 public:
  static StatusOr<std::unique_ptr<TransferEngine>> Create(EngineOptions options);
  ~TransferEngine();
  TransferEngine(const TransferEngine&) = delete;
  TransferEngine& operator=(const TransferEngine&) = delete;

  const std::string& segment_name() const;
  uint16_t rpc_port() const;
  const EngineConfig& config() const;
  /// Names of the installed transports, the preferred network transport first.
  std::vector<std::string> InstalledTransports() const;

  // --- memory ---
  /// kInvalidArgument (null/zero length, a location that names no memory kind), kAddressOverlapped, or a
  /// transport's registration error; republishes the segment descriptor. `location` is Mooncake's ("cpu:0",
  /// "cuda:0", "*"); for "*" or "cpu:N" the platform layer says whether the pointer is device memory.
  Status RegisterMemory(void* addr, size_t length, const std::string& location = "*", bool remote_accessible = true);
  /// kAddressNotRegistered when no registration starts at addr. Waits for transfers still using it.
  Status UnregisterMemory(void* addr);
  std::vector<BufferInfo> LocalBuffers() const;
  /// Whether [addr, addr+length) lies inside one local registration.
  bool IsRegistered(const void* addr, size_t length) const;
  /// Registered memory for transfers. Where the preferred transport allocates its own (device transports:
  /// device memory with the handle type its protocol needs; cxl: the shared device), from it, on `device`
  /// (-1: the transport's default device; >= 0: that device). Else from engine-owned shareable (memfd) host slabs
  /// (power-of-two size classes 8 KiB-256 MiB, larger requests get their own registration); a device >= 0 is then
  /// refused (kInvalidArgument), as host memory is on no device.
  StatusOr<void*> AllocateManaged(size_t length, int device = -1);
  Status FreeManaged(void* addr, size_t length);

  // --- segments ---
  /// kInvalidArgument for an empty name, kNotFound when nothing is published under it. Leading '/' ignored.
  StatusOr<SegmentHandle> OpenSegment(const std::string& name);
  Status CloseSegment(SegmentHandle handle);
  /// The buffers a segment registered (this engine's own, or fetched fresh for a remote one).
  StatusOr<std::vector<BufferInfo>> GetSegmentBuffers(const std::string& name);
  /// Drops the cached descriptor and connections of a segment; the next transfer looks it up again.
  void InvalidateSegment(const std::string& name);
  /// A segment the application describes itself (e.g. files this process may read and write): `name` then
  /// resolves to `descriptor_json` (parsed now: kMalformedJson, kInvalidArgument for an empty name or this
  /// engine's own name) without asking the metadata service, and nothing is published. Its descriptor is marked
  /// `defined_locally`: it is the application's word, not another engine's, so a transport may act on what it
  /// names (a file path) where it would refuse a peer's descriptor. Defining a name again replaces it (the
  /// transports' state for the name is dropped). Thread-safe.
  Status DefineSegment(const std::string& name, const std::string& descriptor_json);
  /// kNotFound when `name` was not defined; afterwards it resolves through the metadata service again.
  Status UndefineSegment(const std::string& name);

  // --- batches ---
  StatusOr<BatchId> AllocateBatch(size_t capacity);
  /// Validates every request first (all-or-nothing): local source inside registered memory, target segment
  /// known, target range inside one of its buffers, reachable by an installed transport. Then starts them.
  Status Submit(BatchId batch, const std::vector<TransferRequest>& requests);
  /// As Submit; `notification` is delivered to the target segment of the first request once every task of
  /// the batch completed successfully (so for writes the data is in place when it arrives).
  Status SubmitWithNotify(BatchId batch, const std::vector<TransferRequest>& requests, Notification notification);
  StatusOr<TransferStatus> GetTaskStatus(BatchId batch, size_t task) const;
  /// The first error of a failed task (ok otherwise).
  Status GetTaskError(BatchId batch, size_t task) const;
  StatusOr<TransferStatus> GetBatchStatus(BatchId batch) const;
  /// Blocks until every task is terminal or `timeout` passes (then the state is PENDING).
  StatusOr<TransferStatus> WaitBatch(BatchId batch, std::chrono::nanoseconds timeout) const;
  /// kBatchBusy while a task is in flight.
  Status FreeBatch(BatchId batch);
  /// Frees the handle now even if tasks are in flight; they finish (or time out) in the background.
  Status ReleaseBatch(BatchId batch);

  /// Moves the requests and returns when they are done: ok when all completed, else the first task's error
  /// (kTimeout when `timeout` passed first). Validation as in Submit. A single small request is driven on
  /// the calling thread where the transport allows it (no hand-off to an I/O thread: lowest latency).
  Status TransferSync(const std::vector<TransferRequest>& requests, std::chrono::nanoseconds timeout,
                      const Notification* notification = nullptr);

  // --- control messages ---
  Status SendNotify(const std::string& segment, const Notification& notification);
  std::vector<Notification> TakeNotifications();
  /// ok when the segment's engine answered a probe within `timeout` (zero: the handshake timeout).
  Status Probe(const std::string& segment, std::chrono::milliseconds timeout = std::chrono::milliseconds(0));

  /// Counters as JSON: per transport (by name) its per-peer path counters; "notifications" (queued, refused:
  /// "dropped", limits); "listeners": "rpc" (the handshake/RPC port: open, accepted, served, timed_out,
  /// evicted, malformed) and per transport with a listener its connections (e.g. "tcp": open, peak, limit,
  /// evicted, refused, stalled).
  std::string StatsJson() const;
  /// This host's NIC priority matrix in Mooncake's JSON shape ({"cpu:N": [[preferred...], [available...]]}),
  /// restricted to the comma-separated `device_filter` when not empty (else MC_TE_FILTERS, else the NICs of
  /// MC_CUSTOM_TOPO_JSON, else all).
  static std::string LocalTopologyJson(const std::string& device_filter);
  /// NICs (address, NUMA node, speed), NUMA nodes with their CPUs and the host id, as JSON (same filtering).
  static std::string LocalHostJson(const std::string& device_filter);

  class Impl;

 private:
  explicit TransferEngine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace mooncake::te

#endif  // MOONCAKE_TRANSFER_ENGINE_API_ENGINE_H_
