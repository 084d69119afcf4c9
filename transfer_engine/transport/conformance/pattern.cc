#include "transfer_engine/transport/conformance/pattern.h"

namespace mooncake::te::conformance {
namespace {

// splitmix64's finaliser: every input bit affects every output bit.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t Word(uint64_t seed, uint64_t word_index) { return Mix(Mix(seed) ^ word_index); }

}  // namespace

uint8_t PatternByte(uint64_t seed, uint64_t index) {
  return static_cast<uint8_t>(Word(seed, index / 8) >> (8 * (index % 8)));
}

void FillPattern(void* data, size_t length, uint64_t seed, uint64_t offset) {
  auto* out = static_cast<uint8_t*>(data);
  size_t i = 0;
  while (i < length) {
    uint64_t index = offset + i;
    uint64_t word = Word(seed, index / 8);
    for (uint64_t b = index % 8; b < 8 && i < length; ++b, ++i) out[i] = static_cast<uint8_t>(word >> (8 * b));
  }
}

bool MatchesPattern(const void* data, size_t length, uint64_t seed, uint64_t offset) {
  const auto* in = static_cast<const uint8_t*>(data);
  size_t i = 0;
  while (i < length) {
    uint64_t index = offset + i;
    uint64_t word = Word(seed, index / 8);
    for (uint64_t b = index % 8; b < 8 && i < length; ++b, ++i) {
      if (in[i] != static_cast<uint8_t>(word >> (8 * b))) return false;
    }
  }
  return true;
}

uint64_t Digest(const void* data, size_t length) {
  const auto* in = static_cast<const uint8_t*>(data);
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < length; ++i) {
    h ^= in[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace mooncake::te::conformance
