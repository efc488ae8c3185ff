// loco relay: a relay for members of the collective behind NAT (runtime/collective/relay.hpp).
#include <signal.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <iostream>
#include <memory>

#include "client/cli/commands.hpp"
#include "client/cli/common.hpp"
#include "runtime/collective/relay.hpp"
#include "runtime/collective/types.hpp"
#include "runtime/security/keys.hpp"

namespace loco::cli {
namespace {

struct RelayArgs {
  std::string bind = "tcp://0.0.0.0:7300";
  double rate_mbit = 0;
  std::string key;        // the cluster key file: only its public key is kept
  std::string relay_key;  // the relay's own key pair; made when missing
  bool insecure = false;
  double handshake_timeout_s = 60;
  size_t max_connections_per_source = 256;
};

int run_relay(const RelayArgs& a) {
  collective::RelayOptions o;
  o.rate_mbit = a.rate_mbit;
  o.handshake_timeout = std::chrono::milliseconds(int64_t(a.handshake_timeout_s * 1000));
  o.max_connections_per_source = a.max_connections_per_source;
  raise_open_file_limit("loco relay");
  const security::Settings cluster = security::resolve(a.key, a.insecure);
  if (cluster.curve) {
    // The relay admits members by the cluster's public key; it must not hold the secret.
    o.security = security::Settings::with_key({cluster.cluster.public_key, {}});
    const std::string path =
        a.relay_key.empty()
            ? (std::filesystem::path(security::default_key_path()).parent_path() / "relay.key")
                  .string()
            : a.relay_key;
    if (!std::filesystem::exists(path))
      security::write_key_file(path, security::generate_key_pair());
    o.own = security::read_key_file(path).cluster;
  }
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);  // before the relay's threads start
  collective::Relay relay(a.bind, std::move(o));
  std::cout << "relay " << relay.endpoint() << ": forwarding " << relay.describe_rate()
            << (relay.public_key().empty() ? ", no CURVE (--insecure)"
                                           : ", public key " + relay.public_key())
            << std::endl;
  int sig = 0;
  sigwait(&stop, &sig);
  std::cout << "relay: stopping (" << relay.forwarded() << " forwarded, " << relay.dropped()
            << " dropped, " << relay.refused() << " refused)" << std::endl;
  return 0;
}

}  // namespace

void add_relay_command(CLI::App& app, Commands& out) {
  auto a = std::make_shared<RelayArgs>();
  auto* relay = app.add_subcommand(
      "relay", "forward the collective's messages between members behind NAT (sealed end to end)");
  relay->add_option("--bind", a->bind, "endpoint to bind, e.g. tcp://0.0.0.0:7300");
  relay->add_option("--rate-mbit", a->rate_mbit, "bound on forwarded bytes, Mbit/s (0: none)");
  relay->add_option("--key", a->key, "the cluster key file (only its public key is used)");
  relay->add_option("--relay-key", a->relay_key,
                    "the relay's own key pair, made when missing (default ~/.loco/relay.key)");
  relay->add_flag("--insecure", a->insecure, "plain TCP, no CURVE");
  relay
      ->add_option("--handshake-timeout-s", a->handshake_timeout_s,
                   "close a connection that has not finished its handshake within this "
                   "(default 60)")
      ->check(CLI::Range(0.1, 3600.0));
  relay->add_option("--max-connections-per-source", a->max_connections_per_source,
                    "connections one address may hold; past it a new one is closed at once "
                    "(default 256; 0: no bound)");
  out.push_back({relay, [a] {
                   try {
                     return run_relay(*a);
                   } catch (const std::exception& e) {
                     std::cerr << "loco relay: " << e.what() << "\n";
                     return 1;
                   }
                 }});
}

}  // namespace loco::cli
