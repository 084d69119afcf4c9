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
/// Device memory (a region whose kind is a device, registered with tcp taking part) goes through chunks of
/// `stager`'s pool (its target half): a WRITE payload is received chunk by chunk, each copied to the device once
/// full, and acknowledged after every copy finished; a READ is copied from the device chunk by chunk and each
/// chunk sent once its copy finished (the header goes with the first; a copy failing before anything was sent is
/// answered kDeviceCopyFailed, one failing later closes the connection). Copies are waited for on the stager's
/// threads, never on the loop; answers still go out in request order. When the pool has no free chunk, or this
/// connection holds its share (a quarter of the target half, at least one chunk), reading stops until a chunk is
/// released (backpressure: nothing is allocated here).
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
    size_t header_len = kResponseHeaderSize;  // 0: a later chunk of a staged READ's payload
    uint64_t seq = 0;
    const char* payload = nullptr;
    size_t payload_len = 0;
    uint64_t addr = 0;  // the registered address a READ payload comes from (payload, unless staged)
    size_t sent = 0;
    RegionPin pin;  // keeps a READ source registered until it is sent
    bool ready = true;      // false while its device copies run (or a staged WRITE's payload is still coming)
    uint64_t stage_id = 0;  // names a staged answer for its copies' continuations
    uint64_t op_id = 0;     // the chunks of one staged READ share it
    size_t staged_len = 0;  // staging bytes this answer holds until sent
    StagingRef staging;     // a staged READ chunk's payload
    // A staged WRITE's acknowledgement: ready once the payload is in and every chunk's copy finished.
    bool write_ack = false;
    bool recv_done = true;
    int pending_copies = 0;
    FrameStatus final_status = FrameStatus::kOk;
  };
  /// Lets a copy's continuation (another thread) find the connection later on its loop, if it still exists.
  struct Anchor {
    ServerConnection* conn;
  };

  /// Reads and answers what can be: the body of OnEvents, also run when a staged copy finished.
  void Pump();
  /// Whether reading must wait (too many answers queued, no free chunk, or this connection's share is staged).
  bool Backlogged() const;
  bool ReadRequests();  // false when the connection was closed
  /// A free chunk of the pool's target half, or null after arranging a Pump once one is released (reading stops
  /// meanwhile: waiting_chunk_). An error when there is no pool.
  StatusOr<StagingRef> TakeChunk(const MemoryKind& kind);
  /// Starts copying the staged WRITE's filled chunk to the device.
  void CopyWriteChunk();
  /// The staged WRITE's payload is all in (or discarded): its acknowledgement goes once its copies finished.
  void FinishStagedWrite();
  /// Stops accepting the staged WRITE's payload (the rest is discarded); answered with `why`.
  void DiscardStagedWrite(FrameStatus why);
  /// Queues the next chunk of the staged READ being answered; false when reading must wait (or it closed).
  bool StageReadChunk();
  /// Runs on the loop after a copy of the answer `id` finished; `bytes` of staging it held are released for a WRITE.
  void OnStaged(uint64_t id, size_t bytes, const Status& st);
  /// The continuation a copy runs on the stager's thread: posts OnStaged(id) to this connection's loop.
  std::function<void(const Status&)> StagedDone(uint64_t id, size_t bytes, StagingRef keep, RegionPin pin);
  Out* FindStaged(uint64_t id);
  /// A staged WRITE's acknowledgement whose payload and copies are done becomes ready (with its final status).
  static void MaybeReady(Out& o);
  static void SetStatus(Out& o, FrameStatus status);
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
  // A staged WRITE (device memory) being received, chunk by chunk.
  bool write_staged_ = false;
  MemoryKind write_kind_;
  uint64_t write_stage_id_ = 0;  // its acknowledgement's stage_id
  StagingRef write_chunk_;       // the chunk being filled (null: one is needed)
  size_t write_chunk_fill_ = 0;
  uint64_t write_chunk_dev_ = 0;  // the device address the chunk's first byte goes to
  // A staged READ whose chunks are being queued.
  size_t read_left_ = 0;
  uint64_t read_seq_ = 0, read_total_ = 0, read_next_addr_ = 0, read_op_id_ = 0;
  bool read_first_ = false;
  RegionPin read_pin_;
  uint64_t read_piece_generation_ = 0;
  uint64_t next_stage_id_ = 1;
  size_t staged_bytes_ = 0;   // staging chunks this connection holds (being filled, copied, or not yet sent)
  size_t max_staged_ = 0;     // its share of the pool's target half
  bool waiting_chunk_ = false;  // reading stopped until the pool releases a chunk
  // Registry generations at which the WRITE destination / the queued READ sources were last known registered:
  // Unregister gives up waiting for pins after a timeout, so a stalled peer must not write or read them after.
  uint64_t write_generation_ = 0;
  uint64_t read_generation_ = 0;
  std::unique_ptr<char[]> discard_;
  std::deque<Out> out_;
  bool want_write_ = false;
  uint32_t interest_ = 0;  // the events registered with the loop
  bool paused_ = false;  // reading stopped (Backlogged)
  std::chrono::steady_clock::time_point frame_start_;  // when the request frame being received began
  std::atomic<std::chrono::steady_clock::rep> last_progress_{0};  // steady_clock ticks
  void Progress() {
    last_progress_.store(std::chrono::steady_clock::now().time_since_epoch().count(), std::memory_order_relaxed);
  }
};

}  // namespace mooncake::te::tcp

#endif  // MOONCAKE_TRANSFER_ENGINE_TRANSPORT_TCP_SERVER_CONNECTION_H_
