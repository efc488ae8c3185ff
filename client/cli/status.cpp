// loco status: nodes, resources and actors of a cluster.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>

#include "client/cli/commands.hpp"
#include "client/cli/common.hpp"
#include "client/dashboard/views.hpp"
#include "runtime/core/runtime.hpp"

namespace loco::cli {
namespace {

void print_status(const ClusterStatus& st) {
  std::printf("head %s   redis %s\n\n", st.head_address.c_str(), st.redis_url.c_str());
  std::printf("%-20s %-22s %-6s %-8s %-28s %s\n", "NODE", "ADDRESS", "STATE", "REACH",
              "RESOURCES (used/total)", "HOST");
  for (const NodeStatus& n : st.nodes) {
    std::string res;
    for (auto& [k, total] : n.node.resources) {
      double used = n.used.count(k) ? n.used.at(k) : 0;
      char buf[64];
      if (k == "memory" || k == "gpu_memory")  // bytes: GiB for people
        std::snprintf(buf, sizeof buf, "%s%s=%.1f/%.1fGiB", res.empty() ? "" : ",", k.c_str(),
                      used / double(1 << 30), total / double(1 << 30));
      else
        std::snprintf(buf, sizeof buf, "%s%s=%g/%g", res.empty() ? "" : ",", k.c_str(), used,
                      total);
      res += buf;
    }
    // REACH: direct (the head dialled it), reverse (only over its own connection to the head),
    // relayed (the collective reaches it through a relay).
    std::printf("%-20s %-22s %-6s %-8s %-28s %s%s\n", n.node.id.c_str(),
                n.node.address.empty() ? "-" : n.node.address.c_str(),
                to_string(n.node.state).c_str(), to_string(n.node.reachability).c_str(),
                res.c_str(), n.node.hostname.c_str(),
                n.node.reason.empty() ? "" : ("  (" + n.node.reason + ")").c_str());
  }
  std::printf("\n%-20s %-16s %-14s %-20s %-10s %-8s %s\n", "ACTOR", "NAME", "CLASS", "NODE",
              "STATE", "GPUS", "RESTARTS");
  for (const ActorInfo& a : st.actors) {
    // The node's GPU indices it holds; "*": shared with other actors (share_gpus).
    const bool holds = a.state == ActorState::alive || a.state == ActorState::pending;
    std::string gpus = holds ? format_gpus(a.gpus) : "-";
    if (holds && a.share_gpus && !a.gpus.empty()) gpus += "*";
    std::printf("%-20s %-16s %-14s %-20s %-10s %-8s %d/%d%s\n", a.id.c_str(),
                a.name.empty() ? "-" : a.name.c_str(), a.class_name.c_str(), a.node_id.c_str(),
                to_string(a.state).c_str(), gpus.c_str(), a.restarts, a.max_restarts,
                a.reason.empty() ? "" : ("  " + a.reason).c_str());
  }
  if (st.actors.size() < st.actors_total)
    std::printf("(%zu of %llu actors; --offset and --limit page through them)\n", st.actors.size(),
                static_cast<unsigned long long>(st.actors_total));
}

}  // namespace

void add_status_command(CLI::App& app, Commands& out) {
  auto address = std::make_shared<std::string>();
  auto query = std::make_shared<StatusQuery>();
  query->limit = 1000;
  auto json = std::make_shared<bool>(false);
  auto* status = app.add_subcommand("status", "nodes, resources and actors of a cluster");
  status->add_option("--address", *address, "head HOST:PORT");
  status->add_option("--state", query->state, "only actors in this state")
      ->check(CLI::IsMember({"pending", "alive", "restarting", "dead"}));
  status->add_option("--node", query->node, "only actors on this node (its id)");
  status->add_option("--offset", query->offset, "skip this many actors (sorted by id)");
  status->add_option("--limit", query->limit, "list at most this many actors (0: all; 1000)");
  status->add_flag("--json", *json, "as JSON (the dashboard's /api/cluster)");
  out.push_back({status, [address, query, json] {
                   auto rt = Runtime::connect(head_address(*address));
                   if (*json)
                     std::printf("%s\n", dashboard::cluster_json(rt.status(*query)).dump(2).c_str());
                   else
                     print_status(rt.status(*query));
                   return 0;
                 }});
}

}  // namespace loco::cli
