// Default implementations of the Backend interface's optional parts.
#include "runtime/backend.h"

#include <cstring>

#include "core/error.h"

namespace serval {

void Backend::copy_rows_to_device(void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch,
                                  int64_t row_bytes, int64_t rows) {
  for (int64_t r = 0; r < rows; ++r)
    copy_to_device(static_cast<char*>(dst) + r * dst_pitch, static_cast<const char*>(src) + r * src_pitch,
                   row_bytes);
}

void Backend::begin_capture() { fail("the ", name(), " backend cannot record graphs"); }

std::unique_ptr<DeviceGraph> Backend::end_capture() { fail("the ", name(), " backend cannot record graphs"); }

}  // namespace serval
