// A Hugging Face folder's config.json (diloco/model/hf_config.cpp), downloaded and so hostile: any
// bytes are either refused (not JSON, or a ConfigError naming a field) or read into a model;
// a model that validates writes a config.json (export_hf's) that reads back as the same model,
// and compares equal to itself.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <string_view>

#include "diloco/data/bounded_json.hpp"
#include "diloco/model/hf_config.hpp"

using namespace loco::diloco;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  nlohmann::json c;
  try {
    // As hf::read_json_object reads a config.json: nesting and memory bounded while parsing.
    c = parse_bounded_json(std::string_view(reinterpret_cast<const char*>(data), size),
                           "config.json");
  } catch (const std::runtime_error&) {
    return 0;
  }
  if (!c.is_object()) return 0;
  HfModel f;
  try {
    f = hf::parse_config(c, "config.json");
  } catch (const ConfigError&) {
    return 0;
  }
  JobConfig job;
  job.model = f.model;
  job.model.vocab = f.vocab;
  job.rounds = 1;
  try {
    job.validate();
  } catch (const ConfigError&) {
    return 0;  // a model no job can run (a heads that does not divide the width, ...)
  }
  hf::compare(f, job.model, f.vocab, "config.json", nullptr);  // the same model: no difference
  const HfModel back = hf::parse_config(hf::config_json(job.model, f.vocab, StDtype::f32), "x");
  if (back.vocab != f.vocab || !model_difference(back.model, f.model).empty()) std::abort();
  return 0;
}
