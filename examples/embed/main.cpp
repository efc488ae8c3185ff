// A program that embeds loco: it joins a cluster, spawns its own actor on every node and
// calls it, then submits a DiLoCo job through the client API and follows it to its end.
//   loco up --workers 2 -- embed JOB.yaml      ($LOCO_ADDRESS: the cluster's head)
#include <cstdlib>
#include <iostream>
#include <set>
#include <string>
#include <vector>

#include <loco/client.hpp>
#include <loco/job.hpp>
#include <loco/runtime.hpp>

#include "greeter.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: embed JOB.yaml   (run under `loco up ... --`, or with LOCO_ADDRESS)\n";
    return 2;
  }
  const char* env = std::getenv("LOCO_ADDRESS");
  const std::string address = env ? env : "127.0.0.1:7070";
  try {
    // The job file is checked here first, as `loco submit` checks it: a refused field is named.
    const loco::diloco::JobConfig cfg = loco::diloco::JobConfig::from_yaml_file(argv[1]);
    std::cout << "embed: loco " << loco::kVersion << ", job " << cfg.name << ": "
              << cfg.total_rounds() << " rounds\n";

    loco::Runtime rt = loco::Runtime::connect(address);
    int nodes = 0;
    for (const auto& n : rt.status().nodes) nodes += n.node.state == loco::NodeState::alive;
    if (nodes == 0) throw loco::ClusterError("the cluster has no live node");

    // One greeter per node: the head places each on the node with the most free CPU.
    std::vector<loco::ActorHandle<embed::Greeter>> greeters;
    for (int i = 0; i < nodes; ++i)
      greeters.push_back(rt.spawn<embed::Greeter>(loco::ActorOptions().with_resources({{"cpu", 1}})));
    std::vector<loco::Future<std::string>> answers;
    for (auto& g : greeters) answers.push_back(g.call(&embed::Greeter::hello, std::string("embed")));
    std::set<std::string> processes;
    for (auto& a : answers) {
      const std::string line = a.get(loco::Millis(30000));
      std::cout << "embed: " << line << "\n";
      processes.insert(line.substr(line.find(" from ") + 6));
    }
    std::cout << "embed: " << greeters.size() << " greeters answered from " << processes.size()
              << " node processes of " << nodes << "\n";
    for (auto& g : greeters) rt.kill(g.id());  // their CPUs back, for the job's workers

    loco::Client client(address);
    loco::JobHandle job = client.submit(loco::JobSpec::from_yaml_file(argv[1]));
    std::cout << "embed: submitted " << job.id() << "\n";
    double last_val = 0;
    for (const loco::RoundReport& r : job.watch()) {
      std::cout << "embed: round " << r.round << "/" << r.rounds << " loss " << r.loss;
      if (r.val_loss > 0) std::cout << " val " << (last_val = r.val_loss);
      std::cout << "\n";
    }
    const loco::JobInfo end = job.wait(loco::Millis(600000));
    const auto rows = job.metrics();  // the rounds' figures, as metrics.jsonl has them
    if (!rows.empty() && rows.back().count("val_loss"))
      std::cout << "embed: metrics: " << rows.size() << " rows, the last round's val_loss "
                << rows.back().at("val_loss") << ", " << job.logs().size() << " log lines\n";
    std::cout << "embed: job " << end.id << " ended "
              << (end.state == loco::JobState::succeeded ? "succeeded" : "not succeeded: " + end.message)
              << ", last validation loss " << last_val << "\n";
    return end.state == loco::JobState::succeeded ? 0 : 1;
  } catch (const loco::Error& e) {
    std::cerr << "embed: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "embed: " << e.what() << "\n";
    return 1;
  }
}
