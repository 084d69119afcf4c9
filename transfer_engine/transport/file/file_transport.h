#ifndef MOONCAKE_TRANSFER_ENGINE_TRANSPORT_FILE_FILE_TRANSPORT_H_
#define MOONCAKE_TRANSFER_ENGINE_TRANSPORT_FILE_FILE_TRANSPORT_H_

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <utility>
#include <string>
#include <thread>
#include <vector>

#include "transfer_engine/common/work_queue.h"
#include "transfer_engine/transport/file/file_config.h"
#include "transfer_engine/transport/file/file_segment.h"
#include "transfer_engine/transport/file/gds.h"
#include "transfer_engine/transport/file/io_queue.h"
#include "transfer_engine/transport/transport.h"

namespace mooncake::te::file {

/// Reads and writes between registered host memory and the files of a file segment (Mooncake's `nvmeof`
/// protocol: a descriptor listing files or block devices, see file_segment.h), with io_uring and O_DIRECT.
/// Addressing is kOffset: target_address - kFileSegmentBase is the offset across the segment's concatenated
/// files. The files are opened on this host under local_path_map[this host] (else file_path), so a segment is
/// reachable wherever its files are visible (local disk, NVMe-oF namespace, shared file system); no peer engine
/// is involved and nothing is served to peers.
///
/// Data path: each slice is one io_uring submission when memory, offset and length meet the file's direct-I/O
/// alignment; otherwise its edge blocks go through the page cache and its whole blocks through O_DIRECT (from an
/// aligned bounce buffer when the memory is misaligned) — see IoQueue. Submit hands slices to one ring driven
/// by a worker thread (MC_FILE_QUEUE_DEPTH in flight); SubmitAndDrive runs them on the caller's thread with a
/// ring of its own (pooled).
///
/// Errors: a file that does not exist (kNotFound), was removed or is shorter than the range (kRemoteRejected,
/// retried once after a descriptor refresh), a read that meets the end of the file (kRemoteRejected), no space
/// (kMemory: a write first reserves its buffer's blocks with fallocate, so it fails before writing anything),
/// any other I/O error (kContext with the errno).
///
/// Trust: paths come from a descriptor someone published; MC_FILE_ALLOWED_DIRS restricts them.
class FileTransport : public Transport {
 public:
  FileTransport();
  ~FileTransport() override;

  std::string name() const override { return "file"; }
  TransportCapabilities capabilities() const override;
  Status Configure(const TransportOptions& options) override;
  Status Start(const TransportContext& ctx) override;
  void Stop() override;
  /// Host memory is moved through io_uring; CUDA memory through cuFile (GDS) when gds_status() says usable;
  /// other device memory is declined.
  StatusOr<RegionRegistration> RegisterRegion(const MemoryRegion& region) override;
  void UnregisterRegion(const MemoryRegion& region) override;
  void Describe(nlohmann::json& descriptor) const override;
  /// A segment with a file buffer whose file exists here (under an allowed directory).
  bool CanReach(const SegmentDescriptor& peer) const override;
  /// Mooncake's own nvmeof descriptors (`scripts/register.py`: `server_name`, buffers `{file_path, length,
  /// local_path_map}`) get what this engine's parser needs: `name` (server_name, else the segment's name),
  /// buffers named "file" at consecutive addresses from kFileSegmentBase, as BuildFileSegmentDescriptor lays
  /// them out. Only for protocol "nvmeof"/"file" and buffers that have a string file_path and a length > 0.
  bool CompleteForeignDescriptor(const std::string& segment_name, nlohmann::json& descriptor) const override;
  void Submit(const SegmentDescriptor& peer, const std::vector<Slice*>& slices) override;
  void SubmitAndDrive(const SegmentDescriptor& peer, const std::vector<Slice*>& slices) override;
  /// Closes the files opened for that segment (reopened on the next transfer).
  void ForgetPeer(const std::string& segment_name) override;
  size_t slice_size() const override { return config_.slice_size; }
  /// {"<segment>": {bytes, slices, errors}, "io": {...}, "gds": "<why unusable>"}
  nlohmann::json Stats() const override;

  /// Why cuFile/GDS is not used on this host (asked through the platform layer at Start).
  const std::string& gds_status() const { return gds_; }

 private:
  struct SegmentCounters {
    std::string name;  // the segment's
    std::atomic<uint64_t> bytes{0}, slices{0}, errors{0};
  };
  /// Turns slices into FileIos; slices that cannot be moved are completed (or failed) here.
  std::vector<FileIo> Prepare(const SegmentDescriptor& peer, const std::vector<Slice*>& slices);
  /// The open file of `path` for segment `peer` (cached per segment and path); paths of descriptors other
  /// engines wrote must lie under file.allowed_dirs, those of a descriptor the application defined need not;
  /// `direct` (the buffer's own choice) overrides file.direct.
  using FileKey = std::tuple<std::string, std::string, int>;  // segment, local path, how it is opened
  static FileKey CacheKey(const SegmentDescriptor& peer, const std::string& path, const FileBuffer& b);
  StatusOr<std::shared_ptr<OpenFile>> OpenCached(const std::string& path, const SegmentDescriptor& peer,
                                                 const FileBuffer& b);
  void DropCached(const OpenFile* file);
  bool IsOpen(const FileKey& key) const;
  /// The cuFileBufRegister'ed range holding `ptr` and the offset in it; {ptr, 0} when none does.
  std::pair<void*, size_t> GdsBase(void* ptr) const;
  Status CheckAllowed(const std::string& path) const;
  SegmentCounters* CountersFor(const std::string& segment);

  FileConfig config_;
  std::vector<std::string> allowed_real_;  // realpath of each allowed dir
  std::vector<std::string> local_names_;
  std::string gds_ = "not probed (transport not started)";
  static constexpr int kGdsThreads = 2;
  std::unique_ptr<Gds> gds_engine_;         // set at Start when cuFile is usable; outlives gds_worker_'s jobs
  std::unique_ptr<WorkQueue> gds_worker_;   // runs the (synchronous) cuFile calls
  std::map<uint64_t, uint64_t> gds_buffers_;  // start -> length of cuFileBufRegister'ed regions (under mu_)
  size_t gds_buffers_size() const {
    std::lock_guard lock(mu_);
    return gds_buffers_.size();
  }
  std::atomic<bool> running_{false};

  std::unique_ptr<IoQueue> queue_;  // driven by worker_
  std::thread worker_;

  mutable std::mutex mu_;
  std::map<FileKey, std::shared_ptr<OpenFile>> files_;
  // By segment name; every segment the application defined counts under kDefinedLocally (such names are often
  // one per object and would grow this map without bound).
  std::map<std::string, std::unique_ptr<SegmentCounters>> counters_;
  static constexpr const char* kDefinedLocally = "(defined locally)";

  // Rings for SubmitAndDrive callers: all kept until Stop (their counters feed Stats), lent one per caller.
  mutable std::mutex pool_mu_;
  std::vector<std::unique_ptr<IoQueue>> drive_queues_;
  std::vector<IoQueue*> idle_queues_;
};

/// The plugin's probe: usable when io_uring works here.
TransportProbe ProbeFileTransport();

/// Why GDS cannot serve this host: asked through the platform layer (a usable CUDA platform?) and dlopen of
/// libcufile.so.0. Never empty.
/// `opened` (may be null) receives the cuFile driver when usable.
std::string ProbeGds(PlatformRegistry* platforms, const std::string& library = "libcufile.so.0",
                     std::unique_ptr<Gds>* opened = nullptr);

}  // namespace mooncake::te::file

#endif  // MOONCAKE_TRANSFER_ENGINE_TRANSPORT_FILE_FILE_TRANSPORT_H_
