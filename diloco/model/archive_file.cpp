#include "diloco/model/archive_file.hpp"

#include <filesystem>
#include <istream>
#include <stdexcept>

#include "diloco/data/bounded_file.hpp"

namespace loco::diloco {

void read_archive(torch::serialize::InputArchive& ar, const std::string& path) {
  auto in = open_job_stream(path, std::ios::in, "checkpoint " + path);
  ar.load_from(*in, torch::kCPU);
}

void write_archive(torch::serialize::OutputArchive& ar, const std::string& path) {
  const std::filesystem::path p(path);
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
  const std::string tmp = path + ".tmp";
  {
    auto out = open_job_stream(tmp, std::ios::out, "checkpoint " + tmp);
    ar.save_to(*out);
    out->flush();
    if (!*out) throw std::runtime_error("checkpoint " + tmp + ": write failed (disk full?)");
  }
  std::filesystem::rename(tmp, path);
}

}  // namespace loco::diloco
