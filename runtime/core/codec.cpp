#include "runtime/core/codec.hpp"

namespace loco {

Blob Blob::from_vector(std::vector<uint8_t>&& bytes) { return from_values(std::move(bytes)); }

Blob Blob::copy_of(const void* data, size_t size) {
  auto* p = static_cast<const uint8_t*>(data);
  return from_vector(std::vector<uint8_t>(p, p + size));
}

namespace detail {

std::vector<Blob>*& blob_sink() {
  thread_local std::vector<Blob>* sink = nullptr;
  return sink;
}

const std::vector<Blob>*& blob_source() {
  thread_local const std::vector<Blob>* source = nullptr;
  return source;
}

}  // namespace detail
}  // namespace loco
