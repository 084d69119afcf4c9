#ifndef MOONCAKE_TRANSFER_ENGINE_TRANSPORT_FILE_FILE_SEGMENT_H_
#define MOONCAKE_TRANSFER_ENGINE_TRANSPORT_FILE_FILE_SEGMENT_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "transfer_engine/api/status.h"
#include "transfer_engine/common/config.h"
#include "transfer_engine/core/metadata.h"
#include "transfer_engine/core/segment_descriptor.h"

namespace mooncake::te::file {

/// A file segment's addresses start here: buffer i covers [kFileSegmentBase + (sum of the lengths before it),
/// + its length), so a request's target_address is kFileSegmentBase plus Mooncake's logical offset across the
/// concatenated files (get_first_buffer_address() + offset, as for any segment). Not 0 because the engine's
/// descriptor parser rejects a buffer at address 0; 4 KiB-aligned (a multiple of every direct-I/O alignment),
/// so the alignment of target_address is that of the file offset.
inline constexpr uint64_t kFileSegmentBase = uint64_t{1} << 40;

/// The location (buffer "name") of a file buffer: MemoryType::kFile.
inline constexpr const char* kFileLocation = "file";

/// One file (or block device) of a file segment.
struct FileSegmentFile {
  std::string path;     ///< Mooncake's `file_path`: the path on the host that owns it
  uint64_t length = 0;  ///< bytes of the file the segment covers (from offset 0); 0: the file's current size
  /// Mooncake's `local_path_map`: host name -> the path under which that host sees the file (an NVMe-oF
  /// namespace mounted there, an NFS mount, ...).
  std::map<std::string, std::string> local_path_map;
};

/// What one file buffer of a descriptor says (read with the untrusted-field helpers).
struct FileBuffer {
  uint64_t addr = 0;
  uint64_t length = 0;
  std::string file_path;
  uint64_t file_offset = 0;  ///< the file offset of the buffer's first byte (`offset`, default 0)
  std::map<std::string, std::string> local_path_map;
  /// `direct` (not Mooncake's): open this file with O_DIRECT or not, whatever file.direct says; a reader's
  /// choice for its own definitions (e.g. the store reads recently written files through the page cache).
  std::optional<bool> direct;
  /// `read_only` (not Mooncake's): open the file read-only; writes to it are refused.
  bool read_only = false;
};

/// Mooncake's nvmeof descriptor (`protocol: "nvmeof"`, `buffers: [{file_path, length, local_path_map}]`) plus the
/// fields this engine needs in every buffer (`name: "file"`, `addr`, `offset`). Each file's length is taken from the
/// file when 0 (it must exist then). kInvalidArgument for no files, an empty path, or a zero length.
StatusOr<std::string> BuildFileSegmentDescriptor(const std::string& segment_name,
                                                 const std::vector<FileSegmentFile>& files);

/// Whether `b` is a file buffer (location "file"), and its fields; kMalformedJson naming what is wrong (a peer's
/// descriptor is untrusted: wrong types, an offset that wraps, local_path_map entries that are not strings).
StatusOr<FileBuffer> ParseFileBuffer(const BufferDescriptor& b);
bool IsFileBuffer(const BufferDescriptor& b);

/// The path of `b` on this host: local_path_map[name] for the first of `local_names` it has, else file_path.
std::string LocalPath(const FileBuffer& b, const std::vector<std::string>& local_names);

/// Publishes a file segment under `segment_name` (Mooncake's key: "nvmeof/<segment>" is stored at
/// mooncake/nvmeof/<segment>) through the metadata service `metadata_conn` (http://, etcd://, redis://; P2P
/// handshake has no store: kInvalidArgument). The returned backend keeps what it published alive (etcd lease,
/// Redis TTL) until it is destroyed. Every engine that opens the segment then reads and writes the files
/// directly with the file transport.
StatusOr<std::unique_ptr<MetadataBackend>> PublishFileSegment(const std::string& metadata_conn,
                                                              const std::string& segment_name,
                                                              const std::vector<FileSegmentFile>& files,
                                                              const EngineConfig& config = EngineConfig::FromEnv());

}  // namespace mooncake::te::file

#endif  // MOONCAKE_TRANSFER_ENGINE_TRANSPORT_FILE_FILE_SEGMENT_H_
