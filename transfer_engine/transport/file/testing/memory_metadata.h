#ifndef MOONCAKE_TRANSFER_ENGINE_TRANSPORT_FILE_TESTING_MEMORY_METADATA_H_
#define MOONCAKE_TRANSFER_ENGINE_TRANSPORT_FILE_TESTING_MEMORY_METADATA_H_

#include <optional>
#include <string>

namespace mooncake::te::file::testing {

/// Linking this library registers the metadata scheme "memkv": "memkv://<store>" is a key-value store held in
/// this process (one per <store> name, shared by every engine and publisher of the process), laid out by
/// KeyValueMetadataBackend exactly as HTTP/etcd/Redis are (mooncake/ram/<name>, mooncake/nvmeof/<name>, ...).
/// Thread-safe. For tests and the benchmark, where no metadata server runs.

/// The value under `key` of store `store`, if any.
std::optional<std::string> MemoryMetadataGet(const std::string& store, const std::string& key);
/// Writes a raw value (a descriptor as another engine, e.g. Mooncake's register.py, would have written it).
void MemoryMetadataPut(const std::string& store, const std::string& key, const std::string& value);

}  // namespace mooncake::te::file::testing

#endif  // MOONCAKE_TRANSFER_ENGINE_TRANSPORT_FILE_TESTING_MEMORY_METADATA_H_
