# The headers `cmake --install` puts under include/loco/: the front doors (include/loco/*.hpp)
# and every header they include, at their paths in this tree (include/loco/runtime/core/...).
# They include one another by relative paths, so the same files work in the tree and installed.
# scripts/check-deps fails when one of them includes a project header that is not listed here.
set(LOCO_FRONT_HEADERS
  include/loco/client.hpp
  include/loco/job.hpp
  include/loco/runtime.hpp
  include/loco/version.hpp)
set(LOCO_PUBLIC_HEADERS
  client/client.hpp
  diloco/job/config.hpp
  runtime/collective/compression.hpp
  runtime/core/actor.hpp
  runtime/core/caller.hpp
  runtime/core/cluster_types.hpp
  runtime/core/codec.hpp
  runtime/core/errors.hpp
  runtime/core/paths.hpp
  runtime/core/registry.hpp
  runtime/core/remote_input.hpp
  runtime/core/runtime.hpp
  runtime/core/util.hpp
  runtime/security/keys.hpp)
