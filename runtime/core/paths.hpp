// The folders a node lets the jobs it hosts read and write: its data root (corpora,
// `data.dir`) and its checkpoint root (`checkpoint.dir`, and every path a job's actors are
// asked to write or read a checkpoint at). `loco start --data-root DIR --checkpoint-root
// DIR`; both default to the node's working directory. A path from a job file or from a
// request is resolved under its root and refused, naming the field, when it leaves it.
#pragma once

#include <stdexcept>
#include <string>

namespace loco {

struct PathRoots {
  std::string data;         // absolute, normalized
  std::string checkpoints;  // absolute, normalized
  // The actors of a job a client key owns: the name of that user's folder in each root
  // (`data` and `checkpoints` are then ROOT/<user>); "" for the operator's (the cluster key).
  std::string user;

  // Both roots at `dir` (made absolute): what a node started without root options uses,
  // with its working directory.
  static PathRoots at(const std::string& dir);
  // The roots of a job that the client key `key` (named `name` in the cluster's key file)
  // owns: its own folder in each root, made (mode 0700) when missing. Users' files apart: a
  // client's job reads and writes nothing of another user's.
  PathRoots for_user(const std::string& key, const std::string& name) const;
};

// The folder of a user in each root: the key file's name for the key when it is a plain one
// ([A-Za-z0-9_-], at most 64 bytes, not starting with '-'), else "key-" and 16 hex digits of
// a hash of the key.
std::string user_folder(const std::string& key, const std::string& name);

// A path that leaves the root it must stay under. what() names the field.
struct PathError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

// `path` (the value of `field`, e.g. "checkpoint.dir") under `root` (absolute): a relative
// path is taken from the root, an absolute one as it is. The result, with ".", ".." and the
// symbolic links of the part that exists resolved, must be the root or inside it; else
// PathError "FIELD: 'PATH' is outside this node's ROOT_NAME 'ROOT' (loco start OPTION)".
// Empty paths and NUL bytes are refused too. Returns the resolved absolute path.
std::string resolve_under(const std::string& root, const std::string& path,
                          const std::string& field, const std::string& root_option);

// Under the data or checkpoint root of the calling actor (this_actor().roots). For a client's
// job a path in another user's folder is refused naming that user.
std::string resolve_data_path(const PathRoots& r, const std::string& path,
                              const std::string& field);
std::string resolve_checkpoint_path(const PathRoots& r, const std::string& path,
                                    const std::string& field);

}  // namespace loco
