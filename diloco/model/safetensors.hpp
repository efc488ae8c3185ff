// The safetensors file format (Hugging Face's), written and read without LibTorch:
// 8 bytes of little-endian header length N, N bytes of JSON header (padded with spaces so
// that the data starts 8-byte aligned), then the tensors' bytes, each at the
// [begin, end) offsets its header entry gives, relative to the data's start.
//   {"__metadata__": {"format": "pt"}, "name": {"dtype": "F32", "shape": [2, 3],
//    "data_offsets": [0, 24]}, ...}
// Values travel as fp32 here; a file holds F32 or BF16 (written) and F32, BF16 or F16 (read).
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace loco::diloco {

// A file that is not valid safetensors, or whose content is not what the reader expects.
// what() names the file and the problem.
class SafetensorsError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class StDtype { f32, bf16, f16 };
const char* to_string(StDtype d);  // "F32", "BF16", "F16": the header's names

struct StTensor {
  std::vector<std::int64_t> shape;
  std::vector<float> values;      // row-major, numel(shape) values
  StDtype stored = StDtype::f32;  // the dtype in the file (read), or to write
};

// Bounds of the reader: a header larger than this is refused before it is read (the format's
// own reference implementation uses the same 100 MB), and so are tensors of more dimensions.
inline constexpr std::uint64_t kMaxSafetensorsHeader = 100'000'000;
inline constexpr std::size_t kMaxSafetensorsRank = 8;

// Writes `tensors` (in the order given) to `path` as `dtype` (f32 or bf16, rounded to the
// nearest even). Throws SafetensorsError on an I/O error or a tensor whose values do not
// match its shape.
void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, StTensor>>& tensors, StDtype dtype);

// Reads every tensor of `path` as fp32. Validates the whole file before trusting any of it:
// the header's length against kMaxSafetensorsHeader and the file's size, the JSON, every
// entry's dtype (F32, BF16, F16), shape and offsets (inside the data, of the size the shape
// and dtype give, no two overlapping, no bytes unaccounted for). Throws SafetensorsError
// naming the file and the first problem.
std::map<std::string, StTensor> read_safetensors(const std::string& path);

}  // namespace loco::diloco
