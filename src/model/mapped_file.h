#pragma once
// Memory-mapped files: read-only views of model files (tensor data stays in the
// page cache, shared between processes) and writable mappings for the GGUF writer.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace serval {

class MappedFile {
 public:
  // Maps `path` read-only; throws naming the path when it cannot be opened or is empty.
  static std::shared_ptr<MappedFile> open_read(const std::string& path);
  // Creates (truncates) `path` with `size` bytes, reserves the disk space and maps it
  // read-write; throws naming the path (e.g. when the disk is full).
  static std::shared_ptr<MappedFile> create(const std::string& path, size_t size);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  uint8_t* mutable_data() { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Unmaps and closes (for writers: after this the file is complete on disk cache).
  void close();

 private:
  MappedFile() = default;
  std::string path_;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  int fd_ = -1;
};

// Reads a whole (small) file into a string; throws naming the path.
std::string read_text_file(const std::string& path);

}  // namespace serval
