// Fuzz target: the safetensors header (8-byte length, JSON) and tensor table of one file image. Every
// tensor the parser accepts must lie inside the image: its first and last bytes are read, so that an
// offset or size check that lets a tensor reach past the end is an out-of-bounds read under ASan.
#include <cstddef>
#include <cstdint>

#include "puredrive/checkpoint/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto file = pd::SafetensorsFile::parse(data, size, "fuzz.safetensors", nullptr);
  if (!file) return 0;
  volatile uint8_t sink = 0;
  for (const pd::TensorInfo& t : file->tensors()) {
    (void)t.numel();
    (void)t.shape_string();
    if (t.nbytes == 0) continue;
    sink = sink ^ t.data[0] ^ t.data[t.nbytes - 1];
  }
  return 0;
}
