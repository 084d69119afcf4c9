#include "transfer_engine/transport/file/open_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace mooncake::te::file {
namespace {

// Used when the file system takes O_DIRECT but reports no alignment (statx without STATX_DIOALIGN): the
// largest logical block size in common use, so requests that meet it are valid everywhere.
constexpr uint32_t kDefaultDioAlign = 4096;

}  // namespace

std::string ErrnoText(int e) { return std::string(strerror(e)) + " (errno " + std::to_string(e) + ")"; }

StatusOr<std::shared_ptr<OpenFile>> OpenFile::Open(const std::string& path, bool direct, bool read_only) {
  std::shared_ptr<OpenFile> f(new OpenFile());
  f->path_ = path;
  int flags = (read_only ? O_RDONLY : O_RDWR) | O_CLOEXEC;
  int fd = open(path.c_str(), flags);
  f->read_only_ = read_only && fd >= 0;
  if (!read_only && fd < 0 && (errno == EACCES || errno == EROFS || errno == EPERM)) {
    flags = O_RDONLY | O_CLOEXEC;
    fd = open(path.c_str(), flags);
    f->read_only_ = fd >= 0;
  }
  if (fd < 0) {
    int e = errno;
    return Status(e == ENOENT ? ErrorCode::kNotFound : ErrorCode::kInvalidArgument,
                  "cannot open file '" + path + "': " + ErrnoText(e));
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !(S_ISREG(st.st_mode) || S_ISBLK(st.st_mode))) {
    close(fd);
    return InvalidArgument("'" + path + "' is not a regular file or block device");
  }
  f->buffered_fd_ = fd;
  f->direct_fd_ = fd;
  if (direct) {
    int dfd = open(path.c_str(), flags | O_DIRECT);
    if (dfd >= 0) {
      f->direct_fd_ = dfd;
      // The buffered descriptor now serves only the partial blocks at the edges of unaligned requests. Its
      // readahead would pull neighbouring blocks into the page cache while O_DIRECT writes to them are in flight,
      // and a page the kernel fails to invalidate after such a write would later read stale: no readahead here.
      (void)posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
      DioAlignment a = QueryDioAlignment(dfd);
      if (a.memory == 0 || a.offset == 0) {
        // No report: tmpfs (which enforces nothing) or an older kernel (assume the common block size).
        a = DioAlignment{kDefaultDioAlign, kDefaultDioAlign};
      }
      f->align_ = a;
    }
  }
  return f;
}

void* OpenFile::Attachment(const std::function<void*()>& make, std::function<void(void*)> release) {
  std::lock_guard lock(attach_mu_);
  if (!attachment_) {
    attachment_ = make();
    if (attachment_) release_attachment_ = std::move(release);
  }
  return attachment_;
}

OpenFile::~OpenFile() {
  if (attachment_ && release_attachment_) release_attachment_(attachment_);
  if (direct_fd_ >= 0 && direct_fd_ != buffered_fd_) close(direct_fd_);
  if (buffered_fd_ >= 0) close(buffered_fd_);
}

Status OpenFile::Reserve(uint64_t end) {
  std::lock_guard lock(reserve_mu_);
  if (!reservable_ || end <= reserved_) return Status::Ok();
  if (read_only_) return Status(ErrorCode::kRemoteRejected, "file '" + path_ + "' is read-only here");
  int r;
  do {
    r = fallocate(buffered_fd_, FALLOC_FL_KEEP_SIZE, static_cast<off_t>(reserved_),
                  static_cast<off_t>(end - reserved_));
  } while (r != 0 && errno == EINTR);
  if (r != 0) {
    int e = errno;
    if (e == EOPNOTSUPP || e == ENOSYS) {
      reservable_ = false;
      return Status::Ok();
    }
    if (e == ENOSPC || e == EDQUOT) {
      return Status(ErrorCode::kMemory, "no space left for file '" + path_ + "' (reserving its " +
                                            std::to_string(end) + " bytes: " + ErrnoText(e) +
                                            "); nothing was written");
    }
    return Status(ErrorCode::kContext, "fallocate of '" + path_ + "' failed: " + ErrnoText(e));
  }
  reserved_ = end;
  return Status::Ok();
}

Status OpenFile::Check(uint64_t end) const {
  struct stat st;
  if (fstat(buffered_fd_, &st) != 0) {
    return Status(ErrorCode::kContext, "fstat of '" + path_ + "': " + ErrnoText(errno));
  }
  if (st.st_nlink == 0) {
    return Status(ErrorCode::kRemoteRejected, "file '" + path_ + "' was removed (during or before the transfer)");
  }
  if (S_ISREG(st.st_mode) && static_cast<uint64_t>(st.st_size) < end) {
    return Status(ErrorCode::kRemoteRejected, "file '" + path_ + "' is " + std::to_string(st.st_size) +
                                                  " bytes, shorter than its segment needs (" + std::to_string(end) +
                                                  "): truncated?");
  }
  return Status::Ok();
}

}  // namespace mooncake::te::file
