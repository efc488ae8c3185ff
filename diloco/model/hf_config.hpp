// Internal to hf_format.cpp and hf_config.cpp: a Hugging Face folder's config.json against
// loco's ModelConfig, both ways (diloco/model/hf_format.hpp has the contracts users see).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "diloco/model/hf_format.hpp"

namespace loco::diloco::hf {

// A file of a Hugging Face folder: `dir`/`name`, which must be a regular file and not a
// symbolic link (a link could leave the node's data root). Throws std::runtime_error naming
// the path.
std::string folder_file(const std::string& dir, const std::string& name);

// The JSON object in `path`, at most `max_bytes`. Throws std::runtime_error naming the path.
nlohmann::json read_json_object(const std::string& path, std::uintmax_t max_bytes);

// config.json (`where` names it in errors) as loco's model; see read_hf_config.
HfModel parse_config(const nlohmann::json& c, const std::string& where);

// The config.json that export_hf writes.
nlohmann::json config_json(const ModelConfig& m, int vocab, StDtype dtype);

// Throws ConfigError naming the config.json field and the job's field (as `model.NAME`) of the
// first difference between the folder's model and the job's (`job` with `vocab`): "where:
// hidden_size is 576, but the job's model.d_model is 512 (...)". `only`: the job file's fields
// to compare (JobConfig::model_given); null: all. A rotary job's context needs only to fit in
// max_position_embeddings; its max_positions (0: unset) must equal it.
void compare(const HfModel& folder, const ModelConfig& job, int vocab, const std::string& where,
             const std::vector<std::string>* only);

}  // namespace loco::diloco::hf
