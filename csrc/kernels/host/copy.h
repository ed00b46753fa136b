// Copies for the receive side of large transfers.
#pragma once
#include <cstddef>

namespace ringtree {

// memcpy, but with non-temporal (streaming) stores where the CPU has them: the destination
// is a large output that will not be read again soon, so writing around the cache saves the
// read-for-ownership of every destination line and keeps the rings in cache. Callers must
// call streaming_copy_fence() before the data is handed to anyone else.
void streaming_copy(void* dst, const void* src, size_t bytes);
void streaming_copy_fence();

}  // namespace ringtree
