#include "diloco/model/torchscript_model.hpp"

#include <torch/csrc/jit/runtime/graph_executor.h>
#include <xxhash.h>

#include <cstdlib>
#include <filesystem>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>

#include "diloco/data/bounded_file.hpp"
#include "diloco/data/data.hpp"

namespace loco::diloco {

namespace {

namespace fs = std::filesystem;

// A torch error in one line: its first, or, for an error inside the TorchScript interpreter
// (whose first line says only that, its tracebacks following), its last, which names it
// ("RuntimeError: index out of range in self").
std::string error_line(const std::string& s) {
  const std::string first = s.substr(0, s.find('\n'));
  if (first.find("failed in the TorchScript interpreter") == std::string::npos) return first;
  const auto end = s.find_last_not_of("\n ");    // not npos: the first line is there
  const auto begin = s.find_last_of('\n', end);  // npos + 1 == 0: the whole text is one line
  return s.substr(begin + 1, end - begin);
}

std::string shape_of(const torch::Tensor& t) {
  std::ostringstream s;
  s << t.sizes();
  return s.str();
}

// The file's bytes, its size bounded before anything is allocated.
std::string read_module_file(const std::string& path, const std::string& what) {
  std::error_code ec;
  const auto status = fs::status(path, ec);
  if (ec || !fs::exists(status))
    throw std::invalid_argument(what + ": no such file (torch.jit.save writes one)");
  if (!fs::is_regular_file(status)) throw std::invalid_argument(what + ": not a regular file");
  try {
    return read_bounded(path, kMaxTorchScriptBytes, what);
  } catch (const std::runtime_error& e) {
    throw std::invalid_argument(e.what());
  }
}

// forward(tokens, targets) -> Tensor, as the schema declares it: two more arguments than self
// that take Tensors (any after them with defaults), and one Tensor returned.
void check_forward(const torch::jit::Module& m, const std::string& what) {
  const auto method = m.find_method("forward");
  if (!method)
    throw std::invalid_argument(what + ": the module has no forward method; loco calls " +
                                "forward(tokens, targets) and trains on the loss it returns");
  const c10::FunctionSchema& schema = method->function().getSchema();
  const auto& args = schema.arguments();  // args[0] is self
  bool ok = args.size() >= 3;
  for (std::size_t i = 1; ok && i < args.size(); ++i)
    ok = i <= 2 ? c10::TensorType::get()->isSubtypeOf(*args[i].type())
                : args[i].default_value().has_value();
  ok = ok && schema.returns().size() == 1 &&
       schema.returns()[0].type()->isSubtypeOf(*c10::TensorType::get());
  if (!ok) {
    std::ostringstream s;
    s << schema;
    throw std::invalid_argument(what + ": forward is `" + s.str() + "`; loco calls " +
                                "forward(tokens, targets) with two int64 Tensors [B, T] and " +
                                "trains on the Tensor it returns, the mean loss");
  }
}

// Equal values, NaN equal to NaN (a buffer may hold NaN and stay unchanged).
bool same_values(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.sizes() != b.sizes() || a.scalar_type() != b.scalar_type()) return false;
  if (!a.is_floating_point()) return torch::equal(a, b);
  return a.eq(b).logical_or(a.isnan().logical_and(b.isnan())).all().item<bool>();
}

}  // namespace

std::string torchscript_path(const ModelConfig& m) {
  return m.torchscript_file.empty() ? m.torchscript : m.torchscript_file;
}

TorchScriptModel::TorchScriptModel(const ModelConfig& m, int vocab)
    : what_("model.torchscript " + torchscript_path(m)), vocab_(vocab) {
  const std::string bytes = read_module_file(torchscript_path(m), what_);
  hash_ = hex64(XXH3_64bits(bytes.data(), bytes.size()));
  if (!m.torchscript_hash.empty() && m.torchscript_hash != hash_)
    throw std::invalid_argument(
        what_ + ": its XXH3-64 is " + hash_ + ", but the job records model.torchscript_hash " +
        m.torchscript_hash + ": not the file the job was described with (on a cluster every " +
        "node must hold the same file; to train another file, leave model.torchscript_hash and " +
        "model.torchscript_parameters out of the job file)");
  try {
    std::istringstream in(bytes);
    module_ = torch::jit::load(in, torch::Device(torch::kCPU));
  } catch (const std::exception& e) {
    throw std::invalid_argument(what_ + ": not a TorchScript module (what torch.jit.save " +
                                "writes): " + error_line(e.what()));
  }
  check_forward(module_, what_);
  std::set<const c10::TensorImpl*> seen;  // a tied parameter is listed under each name
  for (const auto& p : module_.named_parameters(/*recurse=*/true)) {
    if (!seen.insert(p.value.unsafeGetTensorImpl()).second) continue;
    if (p.value.scalar_type() != torch::kFloat32)
      throw std::invalid_argument(what_ + ": parameter " + p.name + " is " +
                                  std::string(c10::toString(p.value.scalar_type())) +
                                  "; loco trains float32 parameters (module.float() before " +
                                  "scripting)");
    if (!p.value.requires_grad())
      throw std::invalid_argument(what_ + ": parameter " + p.name + " is frozen " +
                                  "(requires_grad False); loco trains every parameter (make " +
                                  "a constant a buffer)");
    params_.emplace_back(p.name, p.value);
  }
  if (params_.empty())
    throw std::invalid_argument(what_ + ": the module has no parameters to train");
  if (m.torchscript_parameters != 0 && m.torchscript_parameters != parameter_count())
    throw std::invalid_argument(what_ + ": " + std::to_string(parameter_count()) +
                                " parameters, but the job records model.torchscript_parameters " +
                                std::to_string(m.torchscript_parameters));
  for (const auto& b : module_.named_buffers(/*recurse=*/true)) {
    buffers_.emplace_back(b.name, b.value);
    buffers_at_load_.push_back(b.value.clone());
  }
}

std::int64_t TorchScriptModel::parameter_count() const {
  std::int64_t n = 0;
  for (const auto& [name, p] : params_) n += p.numel();
  return n;
}

torch::Tensor TorchScriptModel::loss(const torch::Tensor& tokens, const torch::Tensor& targets) {
  // The interpreter runs the graph as scripted, op by op through autograd: no plan that
  // depends on how often and how forward ran before (the profiling executor's), so every
  // replica computes the same bits.
  torch::jit::GraphOptimizerEnabledGuard plain(false);
  c10::IValue out;
  try {
    out = module_.forward({tokens, targets});
  } catch (const std::exception& e) {
    throw std::runtime_error(what_ + ": forward(tokens " + shape_of(tokens) + ", targets) " +
                             "failed: " + error_line(e.what()));
  }
  if (!out.isTensor())
    throw std::invalid_argument(what_ + ": forward returned " + out.tagKind() +
                                ", not the loss (a scalar Tensor)");
  torch::Tensor t = out.toTensor();
  if (t.dim() != 0 || !t.is_floating_point())
    throw std::invalid_argument(what_ + ": forward returned a " +
                                std::string(c10::toString(t.scalar_type())) + " tensor of shape " +
                                shape_of(t) + "; loco trains on the mean loss, a scalar " +
                                "(0-dimensional) floating-point tensor");
  if (torch::GradMode::is_enabled() && !t.requires_grad())
    throw std::invalid_argument(what_ + ": forward's loss does not depend on the parameters " +
                                "(it needs no gradient)");
  return t;
}

void TorchScriptModel::to(torch::Device device) {
  module_.to(device);  // in place: params_ and buffers_ are the module's own tensors
  for (auto& b : buffers_at_load_) b = b.to(device);
}

std::vector<std::vector<Range>> TorchScriptModel::fragments(int count) {
  std::vector<std::int64_t> sizes;
  for (const auto& [name, p] : params_) sizes.push_back(p.numel());
  return contiguous_fragments(sizes, count);
}

void TorchScriptModel::check_after_steps() {
  torch::NoGradGuard no_grad;
  for (std::size_t i = 0; i < buffers_.size(); ++i)
    if (!same_values(buffers_[i].second, buffers_at_load_[i]))
      throw std::runtime_error(
          what_ + ": forward changed the buffer " + buffers_[i].first + " (BatchNorm's " +
          "running statistics?); loco averages and checkpoints parameters only, so the " +
          "workers' buffers would drift apart and a resumed job would lose them: use buffers " +
          "that stay constant (LayerNorm in place of BatchNorm)");
}

void TorchScriptModel::probe(int context) {
  torch::NoGradGuard no_grad;
  module_.train(true);
  auto gen = at::detail::getDefaultCPUGenerator();
  const torch::Tensor rng = gen.get_state();
  const torch::Tensor tokens = torch::full({1, context}, vocab_ - 1, torch::kInt64);
  loss(tokens, tokens);
  const bool drew = !torch::equal(rng, gen.get_state());
  gen.set_state(rng);
  if (drew)
    throw std::invalid_argument(
        what_ + ": forward draws random numbers in training mode (dropout?); loco's workers " +
        "and its simulator would draw different ones, and a resumed job others again: use a " +
        "deterministic forward (dropout 0)");
  check_after_steps();
}

void describe_torchscript(JobConfig& cfg) {
  TorchScriptModel m(cfg.model, cfg.vocab_size());
  m.probe(cfg.model.context);
  if (cfg.sync.mode == SyncMode::streaming) m.fragments(cfg.sync.fragments);  // cut, or refused
  cfg.model.torchscript_hash = m.hash();
  cfg.model.torchscript_parameters = m.parameter_count();
  cfg.validate();  // the bounds on a count that is now known
}

void require_code_models_allowed() {
  const char* v = std::getenv("LOCO_ALLOW_CODE_MODELS");
  if (v && std::string(v) == "1") return;
  throw std::invalid_argument(
      "model.torchscript: a TorchScript module is code, which a node runs as its operator; this "
      "node's operator has not allowed it (loco start --allow-code-models; docs/security.md, "
      "\"Code models\")");
}

}  // namespace loco::diloco
