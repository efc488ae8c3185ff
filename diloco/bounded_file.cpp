#include "diloco/bounded_file.hpp"

#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace loco::diloco {

namespace fs = std::filesystem;

std::string read_bounded(const std::string& path, std::uintmax_t max_bytes,
                         const std::string& what) {
  const std::string& name = what.empty() ? path : what;
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  if (ec) throw std::runtime_error(name + ": cannot read (" + ec.message() + ")");
  if (size > max_bytes)
    throw std::runtime_error(name + ": " + std::to_string(size) + " bytes, more than the " +
                             std::to_string(max_bytes) + " allowed");
  std::string bytes(static_cast<std::size_t>(size), '\0');
  std::ifstream in(path, std::ios::binary);
  if (!in.read(bytes.data(), static_cast<std::streamsize>(size)) ||
      in.gcount() != static_cast<std::streamsize>(size))
    throw std::runtime_error(name + ": cannot read its " + std::to_string(size) + " bytes");
  return bytes;
}

}  // namespace loco::diloco
