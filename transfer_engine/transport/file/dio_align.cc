// statx(STATX_DIOALIGN) through the raw system call: glibc's struct statx lacks the direct-I/O fields, so this
// file uses the kernel's <linux/stat.h> definition and includes no glibc stat header.
#include <linux/fcntl.h>
#include <linux/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>

#include "transfer_engine/transport/file/open_file.h"

namespace mooncake::te::file {

DioAlignment QueryDioAlignment(int fd) {
  struct statx st;
  memset(&st, 0, sizeof(st));
  long r = syscall(__NR_statx, fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &st);
  if (r != 0 || !(st.stx_mask & STATX_DIOALIGN)) return DioAlignment{0, 0};
  return DioAlignment{st.stx_dio_mem_align, st.stx_dio_offset_align};
}

}  // namespace mooncake::te::file
