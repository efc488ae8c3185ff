#include "runtime/security/keys.hpp"

#include <sys/stat.h>
#include <zmq.h>

#include <algorithm>
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

std::vector<std::string> Settings::allow_list() const {
  std::vector<std::string> out;
  if (!cluster.public_key.empty()) out.push_back(cluster.public_key);
  for (const auto& k : allowed)
    if (std::find(out.begin(), out.end(), k) == out.end()) out.push_back(k);
  return out;
}

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
  Settings s;
  s.curve = true;
  std::string line;
  int n = 0;
  while (std::getline(f, line)) {
    ++n;
    line = trim(line);
    if (line.empty() || line[0] == '#') continue;
    auto eq = line.find('=');
    if (eq == std::string::npos) bad(path, "line " + std::to_string(n) + " is not `name = value`");
    std::string name = trim(line.substr(0, eq)), value = trim(line.substr(eq + 1));
    if (name != "public-key" && name != "secret-key" && name != "allow")
      bad(path, "line " + std::to_string(n) + ": unknown name `" + name +
                    "` (expected public-key, secret-key or allow)");
    if (!valid_z85_key(value))
      bad(path,
          "line " + std::to_string(n) + ": " + name + " is not a Z85 CURVE key (40 characters)");
    if (name == "public-key") s.cluster.public_key = value;
    if (name == "secret-key") s.cluster.secret_key = value;
    if (name == "allow") s.allowed.push_back(value);
  }
  if (s.cluster.public_key.empty()) bad(path, "no public-key line");
  if (s.cluster.secret_key.empty()) bad(path, "no secret-key line");
  char derived[kZ85KeyLength + 1];
  if (zmq_curve_public(derived, s.cluster.secret_key.c_str()) != 0 ||
      s.cluster.public_key != derived)
    bad(path, "public-key does not belong to secret-key");
  return s;
}

void write_key_file(const std::string& path, const KeyPair& key, bool overwrite) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!overwrite && fs::exists(path, ec))
    throw KeyError("key file " + path +
                   " exists; not overwriting it (--force replaces it, and "
                   "every member of the cluster then needs the new file)");
  fs::path p(path);
  if (p.has_parent_path()) {
    fs::create_directories(p.parent_path(), ec);
    if (ec) throw KeyError("cannot make " + p.parent_path().string() + ": " + ec.message());
  }
  std::ostringstream text;
  text << "# loco cluster key (CURVE). Whoever holds this file can join the cluster and call its\n"
       << "# actors: keep it private (mode 0600) and copy it only to the cluster's members.\n"
       << "public-key = " << key.public_key << "\n"
       << "secret-key = " << key.secret_key << "\n";
  // Created with mode 0600 before anything is written: the secret is never world-readable.
  const std::string tmp = path + ".tmp";
  fs::remove(tmp, ec);
  {
    mode_t old = ::umask(077);
    std::ofstream f(tmp, std::ios::trunc);
    ::umask(old);
    if (!f) throw KeyError("cannot write " + tmp + ": " + std::strerror(errno));
    f << text.str();
    if (!f.flush()) throw KeyError("cannot write " + tmp + ": " + std::strerror(errno));
  }
  ::chmod(tmp.c_str(), 0600);
  fs::rename(tmp, path, ec);
  if (ec) throw KeyError("cannot write " + path + ": " + ec.message());
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
