// Helper process of host_emulation_platform_test: imports a handle exported by its parent and writes a pattern
// into it through the platform (CopyAsync from a host buffer).
//   ipc_child <handle> <owner pid> <length> <pattern byte>
// Exit 0: written; 2: bad arguments; 3: ImportIpc failed (its Status on stderr); 4: classify, copy or close failed.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "transfer_engine/platform/host_emulation/host_emulation_platform.h"

int main(int argc, char** argv) {
  using namespace mooncake::te;
  if (argc != 5) {
    fprintf(stderr, "usage: %s <handle> <owner pid> <length> <pattern byte>\n", argv[0]);
    return 2;
  }
  const std::string handle = argv[1];
  const int pid = atoi(argv[2]);
  const size_t length = strtoull(argv[3], nullptr, 10);
  const int pattern = atoi(argv[4]);
  auto platform = MakeHostEmulationPlatform();
  StatusOr<void*> mapped = platform->ImportIpc(handle, pid, length);
  if (!mapped.ok()) {
    fprintf(stderr, "%s\n", mapped.status().ToString().c_str());
    return 3;
  }
  std::optional<MemoryKind> kind = platform->Classify(*mapped);
  if (!kind || !kind->is_device()) {
    fprintf(stderr, "imported range not classified as device memory\n");
    return 4;
  }
  std::vector<unsigned char> src(length);
  for (size_t i = 0; i < length; ++i) src[i] = static_cast<unsigned char>(pattern + i * 7);
  auto copy = platform->CopyAsync(*mapped, src.data(), length, kind->device);
  if (!copy.ok() || !(*copy)->Wait().ok()) {
    fprintf(stderr, "copy into the imported range failed\n");
    return 4;
  }
  Status closed = platform->CloseIpc(*mapped, length);
  if (!closed.ok()) {
    fprintf(stderr, "%s\n", closed.ToString().c_str());
    return 4;
  }
  printf("%s\n", kind->ToString().c_str());
  return 0;
}
