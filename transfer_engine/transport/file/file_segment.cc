#include "transfer_engine/transport/file/file_segment.h"

#include <sys/stat.h>

#include <nlohmann/json.hpp>

namespace mooncake::te::file {

StatusOr<std::string> BuildFileSegmentDescriptor(const std::string& segment_name,
                                                 const std::vector<FileSegmentFile>& files) {
  if (segment_name.empty()) return InvalidArgument("a file segment needs a name");
  if (files.empty()) return InvalidArgument("file segment '" + segment_name + "' has no files");
  nlohmann::json buffers = nlohmann::json::array();
  uint64_t addr = kFileSegmentBase;
  for (const auto& f : files) {
    if (f.path.empty()) return InvalidArgument("file segment '" + segment_name + "': a file without a path");
    uint64_t length = f.length;
    if (length == 0) {
      struct stat st;
      if (stat(f.path.c_str(), &st) != 0) {
        return InvalidArgument("file segment '" + segment_name + "': cannot stat '" + f.path + "' for its length");
      }
      length = static_cast<uint64_t>(st.st_size);
    }
    if (length == 0) return InvalidArgument("file segment '" + segment_name + "': '" + f.path + "' is empty");
    nlohmann::json map = nlohmann::json::object();
    for (const auto& [host, path] : f.local_path_map) map[host] = path;
    buffers.push_back({{"name", kFileLocation},
                       {"addr", addr},
                       {"length", length},
                       {"offset", uint64_t{0}},
                       {"file_path", f.path},
                       {"local_path_map", map}});
    addr += length;
  }
  nlohmann::json d = {{"name", segment_name},
                      {"server_name", segment_name},
                      {"protocol", "nvmeof"},
                      {"buffers", buffers}};
  return d.dump();
}

bool IsFileBuffer(const BufferDescriptor& b) { return b.name == kFileLocation; }

StatusOr<FileBuffer> ParseFileBuffer(const BufferDescriptor& b) {
  auto bad = [](const std::string& why) {
    return Status(ErrorCode::kMalformedJson, "corrupted file buffer in segment descriptor: " + why);
  };
  if (!IsFileBuffer(b)) return bad("location '" + b.name + "' is not 'file'");
  FileBuffer f;
  f.addr = b.addr;
  f.length = b.length;
  auto path = JsonString(b.json, "file_path");
  if (!path || path->empty()) return bad("no string file_path");
  f.file_path = *path;
  if (b.json.is_object() && b.json.contains("offset")) {
    auto off = JsonUint(b.json, "offset");
    if (!off) return bad("offset is not an unsigned integer");
    f.file_offset = *off;
  }
  if (f.file_offset + f.length < f.file_offset) return bad("offset + length wraps");
  if (b.json.is_object() && b.json.contains("direct")) {
    if (!b.json["direct"].is_boolean()) return bad("direct is not a boolean");
    f.direct = b.json["direct"].get<bool>();
  }
  if (b.json.is_object() && b.json.contains("read_only")) {
    if (!b.json["read_only"].is_boolean()) return bad("read_only is not a boolean");
    f.read_only = b.json["read_only"].get<bool>();
  }
  if (b.json.is_object() && b.json.contains("local_path_map")) {
    const auto& m = b.json["local_path_map"];
    if (!m.is_object()) return bad("local_path_map is not an object");
    for (const auto& [host, p] : m.items()) {
      if (!p.is_string()) return bad("local_path_map['" + host + "'] is not a string");
      f.local_path_map[host] = p.get<std::string>();
    }
  }
  return f;
}

std::string LocalPath(const FileBuffer& b, const std::vector<std::string>& local_names) {
  for (const auto& n : local_names) {
    auto it = b.local_path_map.find(n);
    if (it != b.local_path_map.end() && !it->second.empty()) return it->second;
  }
  return b.file_path;
}

StatusOr<std::unique_ptr<MetadataBackend>> PublishFileSegment(const std::string& metadata_conn,
                                                              const std::string& segment_name,
                                                              const std::vector<FileSegmentFile>& files,
                                                              const EngineConfig& config) {
  auto text = BuildFileSegmentDescriptor(segment_name, files);
  if (!text.ok()) return text.status();
  auto no_store = [&] {
    return InvalidArgument("file segments are published in a metadata service (http://, etcd://, redis://); '" +
                           metadata_conn + "' has no store");
  };
  if (metadata_conn == "P2PHANDSHAKE" || metadata_conn.rfind("p2p://", 0) == 0) return no_store();
  auto backend = CreateMetadataBackend(metadata_conn, config);
  if (!backend.ok()) return backend.status();
  if ((*backend)->names_are_rpc_addresses()) {
    return InvalidArgument("file segments are published in a metadata service (http://, etcd://, redis://); '" +
                           metadata_conn + "' has no store");
  }
  Status st = (*backend)->PublishSegment(segment_name, *text);
  if (!st.ok()) return st;
  return std::move(backend.value());
}

}  // namespace mooncake::te::file
