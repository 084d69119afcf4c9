#ifndef MOONCAKE_TRANSFER_ENGINE_TRANSPORT_CONFORMANCE_PATTERN_H_
#define MOONCAKE_TRANSFER_ENGINE_TRANSPORT_CONFORMANCE_PATTERN_H_

// The byte patterns and digests the conformance suite and its peer process agree on, so either side can say
// what a range must hold without shipping the bytes.

#include <cstddef>
#include <cstdint>

namespace mooncake::te::conformance {

/// The byte that pattern `seed` puts at absolute offset `index` of a buffer: a pseudo-random function of both,
/// so a range copied to the wrong offset, or from the wrong seed, does not match.
uint8_t PatternByte(uint64_t seed, uint64_t index);

/// Writes pattern `seed` into data[0, length), as the bytes at offsets [offset, offset + length) of a buffer.
void FillPattern(void* data, size_t length, uint64_t seed, uint64_t offset);

/// Whether data[0, length) holds pattern `seed` at offsets [offset, offset + length).
bool MatchesPattern(const void* data, size_t length, uint64_t seed, uint64_t offset);

/// 64-bit FNV-1a of data[0, length) (the empty range digests to the offset basis).
uint64_t Digest(const void* data, size_t length);

}  // namespace mooncake::te::conformance

#endif  // MOONCAKE_TRANSFER_ENGINE_TRANSPORT_CONFORMANCE_PATTERN_H_
