// loco keygen: a new cluster key file, or a client key that the cluster key then admits.
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
    bool client = false, admin = false;
    std::string cluster_key;
    std::string label;
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand(
      "keygen",
      "make a cluster key (CURVE) that the head and every node hold, or with --client a user's "
      "key that may submit and watch jobs but not join or call internal methods");
  cmd->add_option("--out", a->out,
                  "where to write it (default: $LOCO_KEY, else ~/.loco/cluster.key; with "
                  "--client it is required)");
  cmd->add_flag("--force", a->force, "replace an existing key file");
  cmd->add_flag("--client", a->client,
                "make a client key and add its public half to the cluster key file (--key)");
  cmd->add_flag("--admin", a->admin,
                "like --client, and the key may cancel, scale, read and call every user's jobs "
                "and actors (still no internal methods)");
  cmd->add_option("--key", a->cluster_key,
                  "with --client: the cluster key file to add it to (default $LOCO_KEY, else "
                  "~/.loco/cluster.key)");
  cmd->add_option("--name", a->label,
                  "with --client: the user's name, kept beside its line; jobs and refusals show "
                  "it (default: the --out path)");
  out.push_back(
      {cmd, [a] {
         const security::KeyPair key = security::generate_key_pair();
         if (a->admin) a->client = true;
         if (!a->client) {
           const std::string path = a->out.empty() ? security::default_key_path() : a->out;
           security::write_key_file(path, key, a->force);
           std::cout << "wrote cluster key " << path << " (public key " << key.public_key
                     << ")\ncopy it to the head and every node, keep it private; they "
                        "find it with --key FILE or $LOCO_KEY. Users get client keys: "
                        "loco keygen --client --out FILE\n";
           return 0;
         }
         if (a->out.empty())
           throw security::KeyError(
               "keygen --client: say where to write the client key "
               "(--out FILE)");
         const std::string cluster_path =
             a->cluster_key.empty() ? security::default_key_path() : a->cluster_key;
         const security::Settings cluster = security::read_key_file(cluster_path);
         if (cluster.is_client())
           throw security::KeyError(cluster_path +
                                    " is a client key; --key must name the cluster's");
         security::write_client_key_file(a->out, key, cluster.cluster.public_key, a->force);
         security::add_client_to_key_file(cluster_path, key.public_key,
                                          a->label.empty() ? a->out : a->label, a->admin);
         std::cout << "wrote " << (a->admin ? "admin" : "client") << " key " << a->out << " (public key " << key.public_key
                   << ") and admitted it in " << cluster_path << "\ncopy " << cluster_path
                   << " to the head and the nodes again (they pick up the new line "
                      "without a restart); give "
                   << a->out << " to its user (--key FILE or $LOCO_KEY)\n";
         return 0;
       }});
}

}  // namespace loco::cli
