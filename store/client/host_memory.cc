// Host memory for the store's zero-copy calls, as C functions (loaded by host_memory.py with ctypes; clients
// also call the first two through the addresses get_alloc_func_addr / get_free_func_addr give them).
//
//   void* mc_host_alloc(size_t size)   page-aligned, zero-filled memory of at least `size` bytes (its own
//                                      anonymous mapping; pages land on the NUMA node the calling thread's
//                                      memory policy prefers), or NULL for size 0 or when the kernel refuses.
//   void  mc_host_free(void* ptr)      releases a block mc_host_alloc returned. NULL is a no-op; any other
//                                      pointer (foreign, interior, already freed) is left alone and reported
//                                      on stderr: never a crash or a double unmap.
//   int   mc_host_release(void* ptr)   mc_host_free returning 0, or -1 (nothing done) for a pointer it refuses.
//   size_t mc_host_block_size(void* ptr)  bytes mapped for the live block starting at ptr, 0 if none.
//   size_t mc_host_live_blocks(void)   number of live blocks.
//   int   mc_host_bind_numa(int node, char* why, size_t why_len)
//                                      binds the calling thread (and threads it starts later) to the CPUs of
//                                      NUMA node `node` (/sys/devices/system/node/node<N>/cpulist) and makes
//                                      the node its preferred memory node. 0; or -1 with the reason in `why`
//                                      (no such node, no usable CPU) and nothing changed. A refused memory
//                                      policy keeps the CPU binding, returns 1 and says why.
//
// Threading: every function is thread-safe; the block table is one mutex-guarded map, never destroyed (so
// frees during process exit stay safe).
#include <errno.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#define MC_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

constexpr int kMpolPreferred = 1;  // <linux/mempolicy.h> MPOL_PREFERRED

struct Blocks {
  std::mutex mu;
  std::unordered_map<uintptr_t, size_t> live;  // start -> mapped bytes
};

Blocks& Table() {
  static Blocks* blocks = new Blocks;  // intentionally leaked: see the threading note above
  return *blocks;
}

size_t PageSize() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

void Say(char* why, size_t why_len, const std::string& text) {
  if (why != nullptr && why_len > 0) std::snprintf(why, why_len, "%s", text.c_str());
}

// "0-3,8,10-11" -> {0,1,2,3,8,10,11}; false for malformed text.
bool ParseList(const std::string& text, std::vector<int>* out) {
  std::stringstream ss(text);
  std::string part;
  while (std::getline(ss, part, ',')) {
    while (!part.empty() && (part.back() == '\n' || part.back() == ' ')) part.pop_back();
    if (part.empty()) continue;
    char* end = nullptr;
    long lo = std::strtol(part.c_str(), &end, 10);
    long hi = lo;
    if (*end == '-') hi = std::strtol(end + 1, &end, 10);
    if (*end != '\0' || lo < 0 || hi < lo || hi > (1 << 20)) return false;
    for (long c = lo; c <= hi; ++c) out->push_back(static_cast<int>(c));
  }
  return true;
}

bool ReadFile(const std::string& path, std::string* text) {
  std::ifstream in(path);
  if (!in) return false;
  std::stringstream ss;
  ss << in.rdbuf();
  *text = ss.str();
  return true;
}

}  // namespace

MC_EXPORT void* mc_host_alloc(size_t size) {
  const size_t page = PageSize();
  if (size == 0 || size > SIZE_MAX - page) return nullptr;
  const size_t bytes = (size + page - 1) / page * page;
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  Blocks& t = Table();
  std::lock_guard<std::mutex> lock(t.mu);
  t.live[reinterpret_cast<uintptr_t>(p)] = bytes;
  return p;
}

MC_EXPORT int mc_host_release(void* ptr) {
  if (ptr == nullptr) return 0;
  size_t bytes = 0;
  {
    Blocks& t = Table();
    std::lock_guard<std::mutex> lock(t.mu);
    auto it = t.live.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == t.live.end()) return -1;
    bytes = it->second;
    t.live.erase(it);  // before the unmap: a racing second free of ptr is refused, never unmaps twice
  }
  munmap(ptr, bytes);
  return 0;
}

MC_EXPORT void mc_host_free(void* ptr) {
  if (mc_host_release(ptr) != 0) {
    std::fprintf(stderr,
                 "mooncake host memory: free(%p) ignored: not a block of this allocator (a foreign or interior "
                 "pointer, or one already freed)\n",
                 ptr);
  }
}

MC_EXPORT size_t mc_host_block_size(void* ptr) {
  Blocks& t = Table();
  std::lock_guard<std::mutex> lock(t.mu);
  auto it = t.live.find(reinterpret_cast<uintptr_t>(ptr));
  return it == t.live.end() ? 0 : it->second;
}

MC_EXPORT size_t mc_host_live_blocks(void) {
  Blocks& t = Table();
  std::lock_guard<std::mutex> lock(t.mu);
  return t.live.size();
}

MC_EXPORT int mc_host_bind_numa(int node, char* why, size_t why_len) {
  const std::string dir = "/sys/devices/system/node/node" + std::to_string(node);
  std::string text;
  std::vector<int> cpus;
  if (node < 0 || !ReadFile(dir + "/cpulist", &text)) {
    std::string online;
    ReadFile("/sys/devices/system/node/online", &online);
    while (!online.empty() && online.back() == '\n') online.pop_back();
    Say(why, why_len, "NUMA node " + std::to_string(node) + " does not exist (nodes: " +
                          (online.empty() ? std::string("none listed") : online) + ")");
    return -1;
  }
  if (!ParseList(text, &cpus) || cpus.empty()) {
    Say(why, why_len, "NUMA node " + std::to_string(node) + " has no CPUs");
    return -1;
  }
  int max_cpu = 0;
  for (int c : cpus) max_cpu = c > max_cpu ? c : max_cpu;
  cpu_set_t* set = CPU_ALLOC(max_cpu + 1);
  const size_t set_bytes = CPU_ALLOC_SIZE(max_cpu + 1);
  CPU_ZERO_S(set_bytes, set);
  for (int c : cpus) CPU_SET_S(c, set_bytes, set);
  const int rc = sched_setaffinity(0, set_bytes, set);
  const int err = errno;
  CPU_FREE(set);
  if (rc != 0) {
    Say(why, why_len, "cannot run on the CPUs of NUMA node " + std::to_string(node) + " (" + text.substr(0, 64) +
                          "): " + std::strerror(err));
    return -1;
  }
  std::string with_memory;
  std::vector<int> memory_nodes;
  if (!ReadFile("/sys/devices/system/node/has_memory", &with_memory) || !ParseList(with_memory, &memory_nodes)) {
    memory_nodes.push_back(node);  // no such list (old kernel): try the policy anyway
  }
  bool has_memory = false;
  for (int n : memory_nodes) has_memory = has_memory || n == node;
  if (!has_memory) {
    Say(why, why_len, "NUMA node " + std::to_string(node) + " has no memory: CPUs bound, memory policy unchanged");
    return 1;
  }
  std::vector<unsigned long> mask(static_cast<size_t>(node) / (8 * sizeof(unsigned long)) + 1, 0);
  mask[static_cast<size_t>(node) / (8 * sizeof(unsigned long))] |= 1UL << (node % (8 * sizeof(unsigned long)));
  if (syscall(SYS_set_mempolicy, kMpolPreferred, mask.data(), mask.size() * 8 * sizeof(unsigned long) + 1) != 0) {
    Say(why, why_len, std::string("CPUs bound; the memory policy was refused: ") + std::strerror(errno));
    return 1;
  }
  return 0;
}
