#include "model/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace serval {

namespace {
std::string errno_text() { return std::strerror(errno); }
}  // namespace

std::shared_ptr<MappedFile> MappedFile::open_read(const std::string& path) {
  std::shared_ptr<MappedFile> f(new MappedFile());
  f->path_ = path;
  f->fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f->fd_ < 0) fail("cannot open \"", path, "\": ", errno_text());
  struct stat st {};
  if (::fstat(f->fd_, &st) != 0) fail("cannot stat \"", path, "\": ", errno_text());
  if (S_ISDIR(st.st_mode)) fail("\"", path, "\" is a directory, expected a file");
  if (st.st_size == 0) fail("\"", path, "\" is empty");
  f->size_ = size_t(st.st_size);
  void* p = ::mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, f->fd_, 0);
  if (p == MAP_FAILED) fail("cannot mmap \"", path, "\": ", errno_text());
  f->data_ = static_cast<uint8_t*>(p);
  return f;
}

std::shared_ptr<MappedFile> MappedFile::create(const std::string& path, size_t size) {
  SERVAL_CHECK(size > 0, "cannot create empty mapped file \"", path, "\"");
  std::shared_ptr<MappedFile> f(new MappedFile());
  f->path_ = path;
  f->fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (f->fd_ < 0) fail("cannot create \"", path, "\": ", errno_text());
  // Reserve the blocks now: writing through a mapping into a full disk would be a
  // SIGBUS later instead of an error message here.
  int rc = ::posix_fallocate(f->fd_, 0, off_t(size));
  if (rc == EOPNOTSUPP || rc == EINVAL) {
    if (::ftruncate(f->fd_, off_t(size)) != 0) fail("cannot resize \"", path, "\": ", errno_text());
  } else if (rc != 0) {
    ::unlink(path.c_str());
    fail("cannot reserve ", size, " bytes for \"", path, "\": ", std::strerror(rc));
  }
  f->size_ = size;
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, f->fd_, 0);
  if (p == MAP_FAILED) fail("cannot mmap \"", path, "\" for writing: ", errno_text());
  f->data_ = static_cast<uint8_t*>(p);
  return f;
}

void MappedFile::close() {
  if (data_) ::munmap(data_, size_);
  if (fd_ >= 0) ::close(fd_);
  data_ = nullptr;
  fd_ = -1;
}

MappedFile::~MappedFile() { close(); }

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open \"", path, "\": ", errno_text());
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) fail("cannot read \"", path, "\"");
  return ss.str();
}

}  // namespace serval
