// A model of the user's own: a TorchScript module (model.torchscript: FILE) that a PyTorch user
// scripts and saves,
//
//   class Lm(nn.Module):
//       def forward(self, tokens, targets):   # int64 [B, T] each
//           return F.cross_entropy(...)        # the mean loss, a scalar
//   torch.jit.script(Lm(...)).save("lm.pt")
//
// and loco trains as it trains the built-in model: its parameters (all float32, all trainable)
// become views into the trainer's flat buffer in named_parameters() order, and the inner loop
// (AdamW, clipping, schedule, accumulation), the pseudo-gradients, the averages, checkpoints
// and streaming fragments all work on that vector. θ0 is the file's weights. What loco cannot
// keep equal across workers is refused, naming it: a forward that draws random numbers
// (dropout) or changes a buffer (BatchNorm's running statistics); buffers that stay constant
// (masks, tables) are fine. The module runs without the graph executor's optimizations
// (fusion, the JIT's own autodiff): its arithmetic is eager PyTorch's whatever the history of
// calls, so that the simulator and every worker compute the same bits.
//
// The file is code: loco runs its forward, as torch.jit.load would. Its size is bounded
// (kMaxTorchScriptBytes) before it is read, and its bytes are hashed as read, so the hash names
// exactly what was loaded.
#pragma once

#include <torch/script.h>
#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "diloco/job/config.hpp"
#include "diloco/model/trainable_model.hpp"

namespace loco::diloco {

inline constexpr std::uintmax_t kMaxTorchScriptBytes = std::uintmax_t(8) << 30;  // 8 GiB

// The file a process reads for `m`: m.torchscript_file where the caller resolved it (under a
// node's data root), else m.torchscript as written.
std::string torchscript_path(const ModelConfig& m);

class TorchScriptModel final : public TrainableModel {
 public:
  // Loads and checks the module at torchscript_path(m) on the CPU: a forward(tokens, targets)
  // returning a Tensor, at least one parameter, every parameter float32 and trainable. Where m
  // records a hash or a parameter count (the job was described), the file must have them.
  // Throws std::invalid_argument naming model.torchscript, the file and what is wrong.
  TorchScriptModel(const ModelConfig& m, int vocab);

  std::vector<std::pair<std::string, torch::Tensor>> named_parameters() override { return params_; }
  // forward(tokens, targets), checked: a scalar floating-point tensor, which needs a gradient
  // while grad mode is on.
  torch::Tensor loss(const torch::Tensor& tokens, const torch::Tensor& targets) override;
  void train(bool on) override { module_.train(on); }
  void to(torch::Device device) override;
  std::vector<std::vector<Range>> fragments(int count) override;
  // Throws if a buffer differs from what the file held.
  void check_after_steps() override;

  // One forward, in training mode without gradients, of a [1, context] batch of the
  // vocabulary's last id: refuses a forward that fails, returns anything but a scalar, draws
  // from the global RNG, or changes a buffer. The global RNG is put back.
  void probe(int context);

  const std::string& hash() const { return hash_; }  // XXH3-64 of the file, 16 hex digits
  std::int64_t parameter_count() const;

 private:
  std::string what_;  // "model.torchscript FILE", for errors
  std::string hash_;
  int vocab_ = 0;
  torch::jit::Module module_;
  std::vector<std::pair<std::string, torch::Tensor>> params_;
  std::vector<std::pair<std::string, torch::Tensor>> buffers_;
  std::vector<torch::Tensor> buffers_at_load_;  // their values as the file held them
};

// Describes cfg.model's TorchScript module in the job: loads it (TorchScriptModel), probes it
// with cfg's context and vocabulary, cuts it into sync.fragments (streaming), and writes its hash and parameter count into cfg.model,
// or, where the job already records them (a job file written at submission, a resumed job),
// checks that the file has them. The simulator does this before it builds its workers, the
// aggregator at submission; the workers then load the file the job describes.
void describe_torchscript(JobConfig& cfg);

// On a cluster a TorchScript module is code a user hands the nodes, run as their operator: a
// node runs it only when its operator started it with `loco start --allow-code-models` (which
// sets $LOCO_ALLOW_CODE_MODELS in the node's process and clears it otherwise). Throws
// std::invalid_argument naming the flag when not. loco-train, a user's own process, asks none.
void require_code_models_allowed();

}  // namespace loco::diloco
