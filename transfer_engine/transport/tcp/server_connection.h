#ifndef MOONCAKE_TRANSFER_ENGINE_TRANSPORT_TCP_SERVER_CONNECTION_H_
#define MOONCAKE_TRANSFER_ENGINE_TRANSPORT_TCP_SERVER_CONNECTION_H_

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <string>

#include "transfer_engine/core/memory_registry.h"
#include "transfer_engine/transport/tcp/device_stager.h"
#include "transfer_engine/transport/tcp/io_loop.h"
#include "transfer_engine/transport/tcp/wire.h"

namespace mooncake::te::tcp {

/// The target side of one data connection: reads request frames, checks every range against the memory
/// registered for remote access, receives WRITE payloads straight into place and acknowledges them after
/// they landed, sends READ payloads straight from memory. A malformed frame closes the connection (logged);
/// a rejected range is answered with kAddressRejected and the connection lives on.
///
/// Device memory (a region whose kind is a device, registered with tcp taking part) goes through `stager`'s pinned
/// buffers: a WRITE payload is received into one and copied to the device before it is acknowledged; a READ is
/// copied from the device into one when its request arrives and sent once the copy finished. Copies are waited for
/// on the stager's thread, never on the loop; answers still go out in request order (one waiting for its copy
/// holds back those behind it), and reading stops while kMaxStagedBytes are staged.
///
/// Threading: used only on its loop's thread, except last_progress() (any thread). Owned by the transport;
/// `on_close` is called (on the loop thread) once the socket is closed, after which the owner deletes it.
class ServerConnection : public EventHandler {
 public:
  /// `stager` may be null (device memory is then refused); it outlives the connection's copies.
  ServerConnection(int fd, IoLoop* loop, const MemoryRegistry* memory, uint64_t max_frame, DeviceStager* stager,
                   std::function<void(ServerConnection*)> on_close);
  ~ServerConnection() override;

  Status Register();
  void OnEvents(uint32_t events) override;
  /// Closes the socket (from the loop thread, or after the loop stopped).
  void Close(const std::string& why);
  /// Whether the connection is in the middle of something (a request frame, a WRITE payload, answers not
  /// yet sent) and has moved no byte for `timeout`, or has been in the middle of one request frame for
  /// `timeout` (a peer trickling a byte now and then): a stuck or hostile peer holding registered memory.
  /// Loop thread only.
  bool Stalled(std::chrono::steady_clock::time_point now, std::chrono::nanoseconds timeout) const;
  /// When a byte last moved in either direction (or the connection was accepted).
  std::chrono::steady_clock::time_point last_progress() const {
    return std::chrono::steady_clock::time_point(
        std::chrono::steady_clock::duration(last_progress_.load(std::memory_order_relaxed)));
  }
  IoLoop* loop() const { return loop_; }

 private:
  struct Out {
    uint8_t header[kResponseHeaderSize];
    uint64_t seq = 0;
    const char* payload = nullptr;
    size_t payload_len = 0;
    uint64_t addr = 0;  // the registered address a READ payload comes from (payload, unless staged)
    size_t sent = 0;
    RegionPin pin;  // keeps a READ source registered until it is sent
    bool ready = true;      // false while its device copy runs
    uint64_t stage_id = 0;  // names a staged answer for its copy's continuation
    size_t staged_len = 0;  // bytes of kMaxStagedBytes this answer holds until sent
    StagingRef staging;     // a staged READ's payload
  };
  /// Lets a copy's continuation (another thread) find the connection later on its loop, if it still exists.
  struct Anchor {
    ServerConnection* conn;
  };

  /// Reads and answers what can be: the body of OnEvents, also run when a staged copy finished.
  void Pump();
  /// Whether reading must wait for answers to go out (too many queued, or too many bytes staged).
  bool Backlogged() const;
  bool ReadRequests();  // false when the connection was closed
  /// The WRITE payload being received into staging is complete: copies it to the device; acknowledged after.
  void FinishStagedWrite();
  /// Starts a staged READ of [addr, addr+len) of `pin`'s device memory; its answer is queued, sent after the copy.
  void StartStagedRead(uint64_t seq, uint64_t addr, size_t len, RegionPin pin);
  /// Runs on the loop after the copy of the answer `id` finished.
  void OnStaged(uint64_t id, const Status& st);
  /// The continuation a copy runs on the stager's thread: posts OnStaged(id) to this connection's loop.
  std::function<void(const Status&)> StagedDone(uint64_t id, StagingRef keep, RegionPin pin);
  /// recv() into dst: bytes read (> 0), 0 when nothing is available, -1 after closing (EOF: `eof_why`).
  ssize_t RecvSome(char* dst, size_t len, const char* eof_why);
  bool Flush();
  void QueueResponse(FrameStatus status, uint64_t seq, const char* payload, size_t len, RegionPin pin);

  int fd_;
  IoLoop* loop_;
  const MemoryRegistry* memory_;
  uint64_t max_frame_;
  DeviceStager* stager_;
  std::function<void(ServerConnection*)> on_close_;
  std::shared_ptr<Anchor> anchor_;
  std::string peer_;
  uint8_t rbuf_[16384];
  size_t rstart_ = 0, rend_ = 0;
  // WRITE payload being received.
  size_t write_left_ = 0;
  uint64_t write_seq_ = 0;
  char* write_dst_ = nullptr;  // null while discarding a rejected payload
  uint64_t write_target_ = 0;  // the registered address the next payload byte is for (write_dst_, unless staged)
  uint64_t write_addr_ = 0;    // the WRITE's start and length
  size_t write_len_ = 0;
  RegionPin write_pin_;
  StagingRef write_staging_;  // where a staged WRITE's payload is received
  uint64_t next_stage_id_ = 1;
  size_t staged_bytes_ = 0;  // bytes of staged WRITEs not yet copied and of staged READs not yet sent
  // Registry generations at which the WRITE destination / the queued READ sources were last known registered:
  // Unregister gives up waiting for pins after a timeout, so a stalled peer must not write or read them after.
  uint64_t write_generation_ = 0;
  uint64_t read_generation_ = 0;
  std::unique_ptr<char[]> discard_;
  std::deque<Out> out_;
  bool want_write_ = false;
  uint32_t interest_ = 0;  // the events registered with the loop
  bool paused_ = false;  // reading stopped because kMaxQueuedResponses answers wait
  std::chrono::steady_clock::time_point frame_start_;  // when the request frame being received began
  std::atomic<std::chrono::steady_clock::rep> last_progress_{0};  // steady_clock ticks
  void Progress() {
    last_progress_.store(std::chrono::steady_clock::now().time_since_epoch().count(), std::memory_order_relaxed);
  }
};

}  // namespace mooncake::te::tcp

#endif  // MOONCAKE_TRANSFER_ENGINE_TRANSPORT_TCP_SERVER_CONNECTION_H_
