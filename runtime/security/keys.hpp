#pragma once
// The cluster's CURVE key and the key file that holds it. No ZeroMQ type here: users and the
// command line see only this header.
//
// Every member of a cluster (head, nodes, clients, the collective's data sockets) holds the
// same key pair: servers prove they hold its secret half, clients too, and each process's ZAP
// handler admits only public keys on the allow-list (the cluster's own, plus any `allow` lines
// of the key file). A process without the file cannot complete a handshake, so none of its
// bytes reach a decoder. See docs/security.md.
#include <stdexcept>
#include <string>
#include <vector>

namespace loco::security {

// The key file is missing, unreadable or malformed; the message names the file and the fix.
class KeyError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct KeyPair {
  std::string public_key;  // Z85, 40 characters
  std::string secret_key;  // Z85, 40 characters
};

// What a process's sockets use.
struct Settings {
  bool curve = false;                // false: plain TCP (only behind --insecure)
  KeyPair cluster;                   // the cluster's key pair, held by every member
  std::vector<std::string> allowed;  // further public keys the ZAP handler admits (Z85)

  static Settings insecure() { return {}; }
  static Settings with_key(KeyPair key) { return Settings{true, std::move(key), {}}; }
  // Every public key the ZAP handler admits: the cluster's and `allowed`.
  std::vector<std::string> allow_list() const;
};

KeyPair generate_key_pair();

// The key file: "public-key = Z85", "secret-key = Z85", optional "allow = Z85" lines, '#'
// comments. Throws KeyError naming the file and the line at fault.
Settings read_key_file(const std::string& path);
// Writes a new key file readable by its owner only (0600), making its folder if needed.
// Refuses (KeyError) to overwrite an existing file unless `overwrite`.
void write_key_file(const std::string& path, const KeyPair& key, bool overwrite = false);

// Where the key is looked for when no --key is given: $LOCO_KEY, else ~/.loco/cluster.key.
std::string default_key_path();

// The settings of a command: `insecure` (--insecure, or LOCO_INSECURE=1 in the environment)
// gives plain TCP; otherwise the key file `key_path` (--key), or default_key_path(). Throws
// KeyError telling how to make a key (`loco keygen`) when there is none.
Settings resolve(const std::string& key_path, bool insecure);

// The allow-list entry of a public key, shortened for logs ("AbCd1234…").
std::string short_key(const std::string& z85_public_key);

}  // namespace loco::security
