#include "transfer_engine/common/shm_names.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>

namespace mooncake::te {
namespace {

unsigned long long PidNamespace() {
  struct stat st;
  return stat("/proc/self/ns/pid", &st) == 0 ? static_cast<unsigned long long>(st.st_ino) : 0ULL;
}

// Reads decimal digits at s[*i] up to a '-'; false when there are none or no '-' follows.
bool Field(const std::string& s, size_t* i, unsigned long long* out) {
  size_t start = *i;
  unsigned long long v = 0;
  while (*i < s.size() && s[*i] >= '0' && s[*i] <= '9' && *i - start < 20) v = v * 10 + (s[(*i)++] - '0');
  if (*i == start || *i >= s.size() || s[*i] != '-') return false;
  ++*i;
  *out = v;
  return true;
}

}  // namespace

std::string ShmOwnerTag() { return std::to_string(PidNamespace()) + "-" + std::to_string(getpid()); }

int RemoveStaleShmFiles(const std::string& prefix, const std::string& dir) {
  const unsigned long long ns = PidNamespace();
  if (ns == 0) return 0;  // cannot tell which files are of this namespace
  DIR* d = opendir(dir.c_str());
  if (!d) return 0;
  int removed = 0;
  while (dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    size_t i = prefix.size();
    unsigned long long file_ns = 0, pid = 0;
    if (!Field(name, &i, &file_ns) || !Field(name, &i, &pid)) continue;
    if (file_ns != ns || pid == 0 || pid > 0x7fffffffULL) continue;
    if (kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;  // alive (or not ours to judge)
    if (unlink((dir + "/" + name).c_str()) == 0) ++removed;
  }
  closedir(d);
  return removed;
}

}  // namespace mooncake::te
