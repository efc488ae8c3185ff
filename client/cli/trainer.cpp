// loco train, loco generate, loco export: handed to loco-train, the LibTorch half of loco,
// so that this binary stays free of LibTorch.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "client/cli/commands.hpp"
#include "client/process.hpp"

namespace loco::cli {

bool is_trainer_command(int argc, char** argv) {
  if (argc < 2) return false;
  const std::string cmd = argv[1];
  return cmd == "train" || cmd == "generate" || cmd == "export";
}

int forward_to_trainer(int argc, char** argv) {
  std::string trainer = executable_dir() + "/loco-train";
  if (::access(trainer.c_str(), X_OK) != 0) {
    std::cerr << "loco: " << argv[1] << " needs " << trainer
              << ", which this build does not have (build with LibTorch: scripts/setup)\n";
    return 2;
  }
  std::vector<char*> args{trainer.data()};
  for (int i = 1; i < argc; ++i) args.push_back(argv[i]);
  args.push_back(nullptr);
  ::execv(trainer.c_str(), args.data());
  std::perror("loco: exec loco-train");
  return 2;
}

void add_trainer_commands(CLI::App& app) {
  app.add_subcommand("train", "train a job in one process (see loco train --help)");
  app.add_subcommand("generate", "sample text from a checkpoint");
  app.add_subcommand("export",
                     "write a checkpoint's model for Hugging Face transformers: "
                     "loco export CKPT --format hf --out DIR");
}

}  // namespace loco::cli
