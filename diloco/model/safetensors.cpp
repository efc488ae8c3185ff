#include "diloco/model/safetensors.hpp"

#include <algorithm>
#include <bit>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "diloco/data/bounded_file.hpp"
#include "diloco/data/bounded_json.hpp"
#include "runtime/collective/compression.hpp"

namespace loco::diloco {

static_assert(std::endian::native == std::endian::little,
              "safetensors stores little-endian values; this reader copies them as they are");

namespace {

std::size_t element_size(StDtype d) { return d == StDtype::f32 ? 4 : 2; }

// The all-reduce codec's conversions (the same rounding as a bf16 or fp16 all-reduce).
collective::Codec codec_of(StDtype d) {
  return d == StDtype::bf16 ? collective::Codec::bf16 : collective::Codec::fp16;
}

// numel of `shape`, or -1 when a dimension is negative or the product overflows.
std::int64_t numel(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (auto d : shape) {
    if (d < 0) return -1;
    if (d != 0 && n > std::numeric_limits<std::int64_t>::max() / d) return -1;
    n *= d;
  }
  return n;
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

const char* to_string(StDtype d) {
  switch (d) {
    case StDtype::f32:
      return "F32";
    case StDtype::bf16:
      return "BF16";
    case StDtype::f16:
      return "F16";
  }
  return "?";
}

void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, StTensor>>& tensors,
                       StDtype dtype) {
  if (dtype == StDtype::f16)
    throw SafetensorsError(path + ": writing F16 is not supported (F32 or BF16)");
  const std::size_t es = element_size(dtype);
  nlohmann::ordered_json header;
  header["__metadata__"] = {{"format", "pt"}};
  std::uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (numel(t.shape) != static_cast<std::int64_t>(t.values.size()))
      throw SafetensorsError(path + ": tensor " + name + " of shape " + shape_text(t.shape) +
                             " has " + std::to_string(t.values.size()) + " values");
    const std::uint64_t bytes = t.values.size() * es;
    header[name] = {{"dtype", to_string(dtype)},
                    {"shape", t.shape},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw SafetensorsError(path + ": cannot open for writing");
  const std::uint64_t n = text.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  std::vector<std::uint8_t> half;
  for (const auto& [name, t] : tensors) {
    if (dtype == StDtype::f32) {
      out.write(reinterpret_cast<const char*>(t.values.data()),
                static_cast<std::streamsize>(t.values.size() * 4));
    } else {
      half.resize(t.values.size() * 2);
      collective::encode_half(codec_of(dtype), t.values.data(), t.values.size(), half.data());
      out.write(reinterpret_cast<const char*>(half.data()),
                static_cast<std::streamsize>(half.size()));
    }
  }
  out.flush();
  if (!out) throw SafetensorsError(path + ": write failed (disk full?)");
}

std::map<std::string, StTensor> read_safetensors(const std::string& path) {
  const auto fail = [&](const std::string& what) { throw SafetensorsError(path + ": " + what); };
  std::unique_ptr<std::iostream> file;
  try {
    file = open_job_stream(path, std::ios::in);
  } catch (const std::runtime_error& e) {
    throw SafetensorsError(e.what());
  }
  std::istream& in = *file;
  in.seekg(0, std::ios::end);
  const auto end = in.tellg();
  if (end < 0) fail("cannot read its size");
  const auto size = static_cast<std::uint64_t>(end);
  in.seekg(0);
  if (size < 8) fail("not a safetensors file (" + std::to_string(size) + " bytes, no header)");
  std::uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  if (n > kMaxSafetensorsHeader)
    fail("header of " + std::to_string(n) + " bytes, more than the " +
         std::to_string(kMaxSafetensorsHeader) + " allowed (not a safetensors file?)");
  if (n > size - 8)
    fail("header of " + std::to_string(n) + " bytes in a file of " + std::to_string(size) +
         " (truncated?)");
  std::string text(n, '\0');
  in.read(text.data(), static_cast<std::streamsize>(n));
  if (!in) fail("cannot read the header");
  nlohmann::json header;
  try {
    header = parse_bounded_json(text, "header");
  } catch (const std::runtime_error& e) {
    fail(e.what());
  }
  if (!header.is_object()) fail("header is not a JSON object");
  const std::uint64_t data_size = size - 8 - n;

  struct Entry {
    std::string name;
    StDtype dtype;
    std::vector<std::int64_t> shape;
    std::uint64_t begin, end;
  };
  std::vector<Entry> entries;
  for (const auto& [name, e] : header.items()) {
    if (name == "__metadata__") continue;
    const std::string where = "tensor '" + name + "'";
    if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") ||
        !e.contains("data_offsets"))
      fail(where + ": expected {dtype, shape, data_offsets}");
    const auto& dt = e["dtype"];
    Entry x{name, StDtype::f32, {}, 0, 0};
    if (dt == "F32")
      x.dtype = StDtype::f32;
    else if (dt == "BF16")
      x.dtype = StDtype::bf16;
    else if (dt == "F16")
      x.dtype = StDtype::f16;
    else
      fail(where + ": dtype " + dt.dump() + " (F32, BF16 or F16 expected)");
    const auto& shape = e["shape"];
    if (!shape.is_array() || shape.size() > kMaxSafetensorsRank)
      fail(where + ": shape " + shape.dump() + " is not a list of at most " +
           std::to_string(kMaxSafetensorsRank) + " sizes");
    for (const auto& d : shape) {
      if (!d.is_number_unsigned()) fail(where + ": shape " + shape.dump() + " is not of sizes");
      x.shape.push_back(d.get<std::int64_t>());
    }
    const auto& off = e["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
        !off[1].is_number_unsigned())
      fail(where + ": data_offsets " + off.dump() + " is not [begin, end]");
    x.begin = off[0].get<std::uint64_t>();
    x.end = off[1].get<std::uint64_t>();
    const std::int64_t count = numel(x.shape);
    if (count < 0 || static_cast<std::uint64_t>(count) > data_size)
      fail(where + ": shape " + shape_text(x.shape) + " is larger than the file");
    if (x.begin > x.end || x.end > data_size)
      fail(where + ": data_offsets [" + std::to_string(x.begin) + ", " + std::to_string(x.end) +
           "] outside the " + std::to_string(data_size) + " bytes of data (truncated?)");
    if (x.end - x.begin != static_cast<std::uint64_t>(count) * element_size(x.dtype))
      fail(where + ": " + std::to_string(x.end - x.begin) + " bytes for shape " +
           shape_text(x.shape) + " of " + to_string(x.dtype));
    entries.push_back(std::move(x));
  }
  // The data is covered exactly once: no overlapping tensors, no unaccounted-for bytes.
  std::vector<const Entry*> order;
  for (const auto& e : entries) order.push_back(&e);
  std::sort(order.begin(), order.end(),
            [](const Entry* a, const Entry* b) { return a->begin < b->begin; });
  std::uint64_t at = 0;
  for (const Entry* e : order) {
    if (e->begin != at)
      fail("tensor '" + e->name + "' starts at byte " + std::to_string(e->begin) +
           " of the data, " + (e->begin < at ? "inside another tensor" : "after a gap") +
           " (expected " + std::to_string(at) + ")");
    at = e->end;
  }
  if (at != data_size)
    fail(std::to_string(data_size - at) + " bytes of data after the last tensor");

  std::map<std::string, StTensor> out;
  std::vector<std::uint8_t> half;
  for (const Entry* e : order) {
    StTensor t;
    t.shape = e->shape;
    t.stored = e->dtype;
    const auto count = static_cast<std::size_t>(numel(e->shape));
    t.values.resize(count);
    in.seekg(static_cast<std::streamoff>(8 + n + e->begin));
    if (e->dtype == StDtype::f32) {
      in.read(reinterpret_cast<char*>(t.values.data()), static_cast<std::streamsize>(count * 4));
    } else {
      half.resize(count * 2);
      in.read(reinterpret_cast<char*>(half.data()), static_cast<std::streamsize>(count * 2));
      collective::decode_half(codec_of(e->dtype), half.data(), count, t.values.data());
    }
    if (!in) fail("cannot read tensor '" + e->name + "'");
    out.emplace(e->name, std::move(t));
  }
  return out;
}

}  // namespace loco::diloco
