#ifndef MOONCAKE_TRANSFER_ENGINE_TRANSPORT_FILE_IO_QUEUE_H_
#define MOONCAKE_TRANSFER_ENGINE_TRANSPORT_FILE_IO_QUEUE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "transfer_engine/api/status.h"
#include "transfer_engine/transport/file/open_file.h"
#include "transfer_engine/transport/file/uring.h"

namespace mooncake::te::file {

/// One transfer between memory and a range of a file.
struct FileIo {
  std::shared_ptr<OpenFile> file;
  bool write = false;
  char* buf = nullptr;
  uint64_t offset = 0;
  size_t length = 0;
  /// Called exactly once with the outcome, on the thread driving the queue, with no lock of the queue held.
  std::function<void(const Status&)> done;
};

/// Counters of an IoQueue (monotonic).
struct IoCounters {
  std::atomic<uint64_t> ios{0};
  std::atomic<uint64_t> bytes{0};
  std::atomic<uint64_t> errors{0};
  std::atomic<uint64_t> direct_pieces{0};    ///< O_DIRECT submissions from the caller's memory
  std::atomic<uint64_t> bounced_pieces{0};   ///< O_DIRECT submissions through an aligned bounce buffer
  std::atomic<uint64_t> buffered_pieces{0};  ///< partial edge blocks, through the page cache
};

/// Moves FileIos with one io_uring, keeping up to `depth` submissions in flight.
///
/// Each FileIo becomes up to three pieces: the partial blocks at its edges (buffered descriptor: the kernel does
/// the read-modify-write) and the whole blocks between them (O_DIRECT, from the caller's memory when it is
/// aligned, else through an aligned bounce buffer). An aligned request is one piece, zero copies. A short
/// transfer is continued where it stopped; a read that meets the end of the file fails (kRemoteRejected, naming
/// the file's size); ENOSPC / EDQUOT fail with kMemory; other errors with kContext and the errno. After the last
/// piece the file is checked (OpenFile::Check) so a file removed or truncated during the transfer fails it.
///
/// Threading: Enqueue from any thread. Completions are reaped by one driver at a time: Run (a dedicated
/// thread, until Stop) or DriveUntilIdle (the caller, for a queue it owns alone).
class IoQueue {
 public:
  /// `private_driver`: only the thread calling DriveUntilIdle ever uses this queue (Enqueue included), so
  /// submission waits for the driver, which submits and waits in one system call.
  explicit IoQueue(unsigned depth, bool private_driver = false);
  /// Fails what is still queued; the driver must have returned and nothing may be in flight (Stop, then join
  /// the thread running Run; or a DriveUntilIdle that returned).
  ~IoQueue();

  /// Creates the ring. kNotImplemented when io_uring is unavailable.
  Status Init();
  /// Queues the transfers and submits as many as the depth allows. After Stop, each fails at once.
  void Enqueue(std::vector<FileIo> ios);
  /// Reaps and completes until Stop is called and nothing is in flight (the transfers still queued then fail).
  void Run();
  /// Makes Run return; idempotent.
  void Stop();
  /// Reaps and completes until nothing is queued or in flight.
  void DriveUntilIdle();

  const IoCounters& counters() const { return counters_; }

 private:
  struct Op;
  struct Piece {
    Op* op = nullptr;
    int fd = -1;
    bool direct = false;
    char* buf = nullptr;
    uint64_t offset = 0;
    size_t length = 0;
    size_t done = 0;
  };
  struct Op {
    FileIo io;
    Piece pieces[3];
    int count = 0;
    int remaining = 0;
    char* bounce = nullptr;  // aligned copy of the middle piece, or null
    char* bounce_user = nullptr;
    size_t bounce_len = 0;
    Status status;
  };

  /// Splits `io` into pieces (allocating a bounce buffer when needed). kMemory when that fails.
  Status Plan(Op* op);
  /// Prepares queued pieces while there is room; then submits. mu_ held.
  void FillLocked();
  /// Fails every queued piece (stopping). mu_ held.
  void DrainQueuedLocked(std::vector<Op*>& finished);
  /// Handles one completion. mu_ held.
  void OnCompletion(Piece* p, int res, std::vector<Op*>& finished);
  void FinishPiece(Piece* p, std::vector<Op*>& finished);
  /// Ends `op` (copies out a bounce buffer, checks the file) and hands it to the caller through `finished`.
  void Finalize(Op* op, std::vector<Op*>& finished);
  /// Counts and calls the callbacks of `finished` (no lock held), then frees them.
  void Complete(std::vector<Op*>& finished);
  /// One round: wait for a completion, reap it all, refill. False once stopped and drained.
  bool Step(bool until_stopped);

  const unsigned depth_;
  const bool private_;
  Ring ring_;
  std::mutex mu_;
  std::deque<Piece*> queued_;
  unsigned in_flight_ = 0;
  size_t live_ops_ = 0;
  bool stopping_ = false;
  bool wake_pending_ = false;
  IoCounters counters_;
};

}  // namespace mooncake::te::file

#endif  // MOONCAKE_TRANSFER_ENGINE_TRANSPORT_FILE_IO_QUEUE_H_
