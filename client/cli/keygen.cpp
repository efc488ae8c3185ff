// loco keygen: a new cluster key file.
#include <CLI/CLI.hpp>
#include <iostream>
#include <memory>

#include "client/cli/commands.hpp"
#include "runtime/security/keys.hpp"

namespace loco::cli {

void add_keygen_command(CLI::App& app, Commands& out) {
  struct Args {
    std::string out;
    bool force = false;
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand(
      "keygen", "make a cluster key (CURVE): every head, node and client of a cluster needs it");
  cmd->add_option("--out", a->out,
                  "where to write it (default $LOCO_KEY, else ~/.loco/cluster.key)");
  cmd->add_flag("--force", a->force, "replace an existing key file");
  out.push_back({cmd, [a] {
                   const std::string path = a->out.empty() ? security::default_key_path() : a->out;
                   const security::KeyPair key = security::generate_key_pair();
                   security::write_key_file(path, key, a->force);
                   std::cout << "wrote cluster key " << path << " (public key " << key.public_key
                             << ")\ncopy it to every member of the cluster, keep it private; "
                                "they find it with --key FILE or $LOCO_KEY\n";
                   return 0;
                 }});
}

}  // namespace loco::cli
