#include "runtime/security/keys.hpp"

#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace loco::security {
namespace {

constexpr size_t kZ85KeyLength = 40;

bool valid_z85_key(const std::string& k) {
  if (k.size() != kZ85KeyLength) return false;
  uint8_t raw[32];
  return zmq_z85_decode(raw, k.c_str()) != nullptr;
}

std::string trim(const std::string& s) {
  const char* ws = " \t\r";
  auto b = s.find_first_not_of(ws);
  if (b == std::string::npos) return {};
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

[[noreturn]] void bad(const std::string& path, const std::string& what) {
  throw KeyError("key file " + path + ": " + what + " (make a new one with `loco keygen --out " +
                 path + " --force`)");
}

}  // namespace

KeyPair generate_key_pair() {
  char pub[kZ85KeyLength + 1], sec[kZ85KeyLength + 1];
  if (zmq_curve_keypair(pub, sec) != 0)
    throw KeyError(std::string("cannot make a CURVE key pair: ") + zmq_strerror(zmq_errno()) +
                   " (is libzmq built with libsodium?)");
  return KeyPair{pub, sec};
}

Settings read_key_file(const std::string& path) {
  std::ifstream f(path);
  if (!f) {
    throw KeyError("no cluster key at " + path + ": " + std::strerror(errno) +
                   ". Make one with `loco keygen` (or give one with --key FILE or $LOCO_KEY; "
                   "--insecure runs without encryption)");
  }
  KeyPair pair;
  std::string cluster_key;
  std::vector<std::string> clients, admins;
  std::map<std::string, std::string> names;
  std::string line;
  int n = 0;
  while (std::getline(f, line)) {
    ++n;
    line = trim(line);
    if (line.empty() || line[0] == '#') continue;
    auto eq = line.find('=');
    if (eq == std::string::npos) bad(path, "line " + std::to_string(n) + " is not `name = value`");
    std::string name = trim(line.substr(0, eq)), value = trim(line.substr(eq + 1));
    // A note may follow the value after white space and '#' (Z85 has '#' but no space).
    std::string note;
    if (auto space = value.find_first_of(" \t"); space != std::string::npos) {
      const std::string rest = trim(value.substr(space));
      if (!rest.empty() && rest[0] != '#')
        bad(path, "line " + std::to_string(n) + ": more than one value after `" + name + " =`");
      if (!rest.empty()) note = trim(rest.substr(1));
      value.resize(space);
    }
    if (name == "allow") name = "client";
    if (name != "public-key" && name != "secret-key" && name != "client" && name != "admin" &&
        name != "cluster-key")
      bad(path, "line " + std::to_string(n) + ": unknown name `" + name +
                    "` (expected public-key, secret-key, client, admin or cluster-key)");
    if (!valid_z85_key(value))
      bad(path,
          "line " + std::to_string(n) + ": " + name + " is not a Z85 CURVE key (40 characters)");
    if (name == "public-key") pair.public_key = value;
    if (name == "secret-key") pair.secret_key = value;
    if (name == "client" || name == "admin") {
      clients.push_back(value);
      names[value] = user_name(note, value);
    }
    if (name == "admin") admins.push_back(value);
    if (name == "cluster-key") cluster_key = value;
  }
  if (pair.public_key.empty()) bad(path, "no public-key line");
  if (pair.secret_key.empty()) bad(path, "no secret-key line");
  char derived[kZ85KeyLength + 1];
  if (zmq_curve_public(derived, pair.secret_key.c_str()) != 0 || pair.public_key != derived)
    bad(path, "public-key does not belong to secret-key");
  Settings s;
  if (!cluster_key.empty() && cluster_key != pair.public_key) {
    if (!clients.empty()) bad(path, "a client key file (it has a cluster-key line) lists clients");
    s = Settings::for_client(pair, cluster_key);
  } else {
    s = Settings::with_key(pair);
    s.clients = std::move(clients);
    s.admins = std::move(admins);
    s.names = std::move(names);
  }
  s.key_file = path;
  return s;
}

namespace {

// Writes `text` to `path` through a temporary file created with mode 0600 before anything is
// written: a secret is never world-readable, and a reader never sees half a file. The temporary
// file is this call's own, and without `overwrite` the file appears by link(2), which fails when
// `path` exists: of two processes making the same key at once (two `loco up` on a fresh
// machine, ctest -j), one writes it and the other is told that it exists, instead of both
// renaming over each other (each then held another key) or one removing the other's temporary
// file.
void write_private(const std::string& path, const std::string& text, bool overwrite) {
  namespace fs = std::filesystem;
  std::error_code ec;
  auto exists = [&] {
    return KeyError("key file " + path +
                    " exists; not overwriting it (--force replaces it, and "
                    "every member of the cluster then needs the new file)");
  };
  if (!overwrite && fs::exists(path, ec)) throw exists();
  fs::path p(path);
  if (p.has_parent_path()) {
    fs::create_directories(p.parent_path(), ec);
    if (ec) throw KeyError("cannot make " + p.parent_path().string() + ": " + ec.message());
  }
  static std::atomic<uint64_t> calls{0};
  const std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." +
                          std::to_string(calls.fetch_add(1, std::memory_order_relaxed));
  fs::remove(tmp, ec);
  {
    mode_t old = ::umask(077);
    std::ofstream f(tmp, std::ios::trunc);
    ::umask(old);
    if (!f) throw KeyError("cannot write " + tmp + ": " + std::strerror(errno));
    f << text;
    if (!f.flush()) {
      const int err = errno;
      fs::remove(tmp, ec);
      throw KeyError("cannot write " + tmp + ": " + std::strerror(err));
    }
  }
  ::chmod(tmp.c_str(), 0600);
  if (overwrite) {
    fs::rename(tmp, path, ec);
    if (ec) {
      const std::string why = ec.message();  // before remove() reuses ec
      fs::remove(tmp, ec);
      throw KeyError("cannot write " + path + ": " + why);
    }
    return;
  }
  const int linked = ::link(tmp.c_str(), path.c_str());
  const int err = errno;
  fs::remove(tmp, ec);
  if (linked == 0) return;
  if (err == EEXIST) throw exists();
  throw KeyError("cannot write " + path + ": " + std::strerror(err));
}

}  // namespace

void write_key_file(const std::string& path, const KeyPair& key, bool overwrite) {
  std::ostringstream text;
  text << "# loco cluster key (CURVE). Whoever holds this file is a member of the cluster: it can\n"
       << "# join as a node and call every actor. Keep it private (mode 0600) and copy it only to\n"
       << "# the cluster's head and nodes; give users client keys (loco keygen --client).\n"
       << "public-key = " << key.public_key << "\n"
       << "secret-key = " << key.secret_key << "\n";
  write_private(path, text.str(), overwrite);
}

void write_client_key_file(const std::string& path, const KeyPair& own,
                           const std::string& cluster_public_key, bool overwrite) {
  std::ostringstream text;
  text << "# loco client key (CURVE). It lets its holder submit, watch and cancel jobs and spawn\n"
       << "# and call actors of the cluster below, but not call their internal methods or join.\n"
       << "public-key = " << own.public_key << "\n"
       << "secret-key = " << own.secret_key << "\n"
       << "cluster-key = " << cluster_public_key << "\n";
  write_private(path, text.str(), overwrite);
}

std::string user_name(const std::string& note, const std::string& public_key) {
  std::string safe;
  for (char c : note.substr(0, 64))
    safe += (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_' ||
             c == '@' || c == '/')
                ? c
                : '_';
  return safe.empty() ? "key " + public_key.substr(0, 8) : safe;
}

void add_client_to_key_file(const std::string& path, const std::string& public_key,
                            const std::string& label, bool admin) {
  const Settings s = read_key_file(path);
  if (s.is_client())
    throw KeyError("key file " + path +
                   " is a client key, not the cluster's: give the cluster key (--key FILE)");
  if (!valid_z85_key(public_key)) throw KeyError("not a Z85 CURVE public key: " + public_key);
  if (std::find(s.clients.begin(), s.clients.end(), public_key) != s.clients.end()) return;
  const std::string safe = label.empty() ? std::string() : user_name(label, public_key);
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  std::string body = text.str();
  if (!body.empty() && body.back() != '\n') body += '\n';
  body += std::string(admin ? "admin" : "client") + " = " + public_key + (safe.empty() ? "" : "  # " + safe) + "\n";
  write_private(path, body, true);
}

std::string default_key_path() {
  if (const char* k = std::getenv("LOCO_KEY"); k && *k) return k;
  const char* home = std::getenv("HOME");
  return std::string(home && *home ? home : ".") + "/.loco/cluster.key";
}

Settings resolve(const std::string& key_path, bool insecure) {
  if (!insecure) {
    const char* env = std::getenv("LOCO_INSECURE");
    insecure = env && std::string(env) == "1";
  }
  if (insecure) return Settings::insecure();
  return read_key_file(key_path.empty() ? default_key_path() : key_path);
}

std::string short_key(const std::string& k) { return k.substr(0, 8) + "…"; }

}  // namespace loco::security
