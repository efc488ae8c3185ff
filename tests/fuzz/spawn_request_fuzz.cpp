// The head's spawn request, as a client can send it: the arguments' msgpack decoded under the
// runtime's bounds (unpack_bounded, then the tuple the head's `spawn` takes), checked as the
// head checks it (check_spawn_request, check_resources), and what it accepts then placed on a
// few nodes. Whatever passes must be a request placement can count: finite, non-negative
// amounts, sizes within the bounds.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "runtime/core/codec.hpp"
#include "runtime/core/decisions.hpp"

using namespace loco;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  SpawnRequest req;
  try {
    auto handle = detail::unpack_bounded(reinterpret_cast<const char*>(data), size, "spawn");
    req = std::get<0>(handle.get().as<std::tuple<SpawnRequest>>());
  } catch (const std::exception&) {
    return 0;  // refused before the head looks at it: what the runtime answers with an error
  }
  const std::set<std::string> declared = {"cpu", "ssd"};
  if (!check_spawn_request(req, nullptr).empty()) return 0;
  if (!check_resources(req.resources, declared).empty()) return 0;
  for (const auto& [name, amount] : req.resources)
    if (!std::isfinite(amount) || amount < 0 || amount > 1e15) __builtin_trap();
  if (req.class_name.empty() || req.class_name.size() > kMaxJobNameBytes) __builtin_trap();

  std::vector<NodeRecord> nodes(3);
  for (size_t i = 0; i < nodes.size(); ++i) {
    nodes[i].id = "n-" + std::to_string(i);
    nodes[i].resources = {{"cpu", 4.0 * double(i)}, {"gpu", double(i)}, {"ssd", 1}};
    nodes[i].spawnable = {"test.*"};
  }
  std::vector<ActorInfo> placed;
  auto views = node_views(nodes, placed);
  for (int k = 0; k < 4; ++k) {
    Placement where = place(views, req.resources.empty() ? Resources{{"cpu", 1}} : req.resources,
                            {}, req.share_gpus);
    if (!where.node) break;
    ActorInfo a;
    a.id = "a-" + std::to_string(k);
    a.node_id = *where.node;
    a.state = ActorState::alive;
    a.resources = req.resources;
    a.gpus = where.gpus;
    occupy(views, a);
    // A node never holds more of a resource than it has.
    for (const NodeView& v : views)
      for (const auto& [name, used] : v.used) {
        auto total = v.total.find(name);
        if (name != "gpu" && total != v.total.end() && used > total->second + 1e-9)
          __builtin_trap();
      }
  }
  (void)class_matches(nodes[0].spawnable, req.class_name);
  return 0;
}
