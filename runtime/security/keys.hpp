#pragma once
// The cluster's CURVE key and the key file that holds it. No ZeroMQ type here: users and the
// command line see only this header.
//
// Every member of a cluster (head, nodes, the actors' collective sockets) holds the same key
// pair, the cluster key: servers prove they hold its secret half, and so do members when they
// call. A client (`loco status`, `loco submit`, a driver) holds either the cluster key, and is
// then a member, or a client key of its own, whose public half the cluster key file lists on a
// `client` line. Each process's ZAP handler admits only those keys and tags each connection
// with its role (Role): a client may call what clients call, never an internal method, and
// never a collective socket. A process without a key cannot complete a handshake, so none of
// its bytes reach a decoder. See docs/security.md.
#include <map>
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

// What a connection's key lets it do. A member holds the cluster key; a client a key listed on
// a `client` (or `admin`) line. Without CURVE (--insecure) every connection is a member.
enum class Role { member, client };

// Who is at the other end of a connection, as its key proves: the role, and for a client its
// public key (what owns its jobs and actors), its name (the note after its key's line in the
// cluster key file, "alice") and whether that line is an `admin` line (an admin may act on
// every user's jobs and actors, still not call internal methods). A member has no key or name
// here: it is the cluster's operator.
struct Identity {
  Role role = Role::member;
  std::string key;
  std::string name;
  bool admin = false;
  bool member() const { return role == Role::member; }
  // May act on what the key `owner` owns ("" : the operator's): a member or an admin always,
  // a client on its own.
  bool may_act_on(const std::string& owner) const {
    return member() || admin || (!owner.empty() && owner == key);
  }
};

// What a process's sockets use.
struct Settings {
  bool curve = false;  // false: plain TCP (only behind --insecure)
  // The cluster's key pair, held by every member. A client's settings hold only its public
  // half, which the servers prove they hold.
  KeyPair cluster;
  // A client's own key pair (empty for a member): what it presents when it calls.
  KeyPair client;
  // Public keys (Z85) admitted with the client role: the key file's `client` and `admin` lines
  // (each admin is in both lists), and the name each line's note gives ("" when none).
  std::vector<std::string> clients;
  std::vector<std::string> admins;
  std::map<std::string, std::string> names;
  // The key file these came from ("" when made in memory). Servers re-read its `client` lines
  // when it changes, so a client added by `loco keygen --client` gets in without a restart.
  std::string key_file;

  static Settings insecure() { return {}; }
  static Settings with_key(KeyPair key) {
    Settings s;
    s.curve = true;
    s.cluster = std::move(key);
    return s;
  }
  // A client's settings: its own pair, and the public key of the cluster it calls.
  static Settings for_client(KeyPair own, std::string cluster_public_key) {
    Settings s;
    s.curve = true;
    s.cluster = KeyPair{std::move(cluster_public_key), {}};
    s.client = std::move(own);
    return s;
  }
  bool is_client() const { return curve && !client.public_key.empty(); }
  // The key pair this process presents when it calls: its client key, else the cluster's.
  const KeyPair& own() const { return is_client() ? client : cluster; }
};

KeyPair generate_key_pair();

// The key file, '#' comments allowed:
//   cluster key: "public-key = Z85", "secret-key = Z85", optional "client = Z85  # NAME" and
//                "admin = Z85  # NAME" lines (the public keys of client key files, and the names
//                their jobs show; "allow" is read as "client");
//   client key:  "public-key" and "secret-key" of the client's own pair, and
//                "cluster-key = Z85", the public key of the cluster it calls.
// Throws KeyError naming the file and the line at fault.
Settings read_key_file(const std::string& path);
// Writes a new cluster key file readable by its owner only (0600), making its folder if
// needed. Refuses (KeyError) to overwrite an existing file unless `overwrite`.
void write_key_file(const std::string& path, const KeyPair& key, bool overwrite = false);
// Writes a client key file (`own`, and the cluster's public key), as write_key_file does.
void write_client_key_file(const std::string& path, const KeyPair& own,
                           const std::string& cluster_public_key, bool overwrite = false);
// Appends "client = PUBLIC  # label" (or "admin = ...") to the cluster key file at `path` (a
// client key file there is refused). The cluster's servers pick it up when they next see the
// file change.
void add_client_to_key_file(const std::string& path, const std::string& public_key,
                            const std::string& label, bool admin = false);

// A user's name as jobs and messages show it: the note of its key's line cut to 64 bytes of
// [A-Za-z0-9._@/-] (others become '_'), or the key's first characters when there is none.
std::string user_name(const std::string& note, const std::string& public_key);

// Where the key is looked for when no --key is given: $LOCO_KEY, else ~/.loco/cluster.key.
std::string default_key_path();

// The settings of a command: `insecure` (--insecure, or LOCO_INSECURE=1 in the environment)
// gives plain TCP; otherwise the key file `key_path` (--key), or default_key_path(). Throws
// KeyError telling how to make a key (`loco keygen`) when there is none.
Settings resolve(const std::string& key_path, bool insecure);

// The allow-list entry of a public key, shortened for logs ("AbCd1234…").
std::string short_key(const std::string& z85_public_key);

}  // namespace loco::security
