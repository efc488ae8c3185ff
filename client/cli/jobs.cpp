// loco submit, jobs, logs, cancel, scale: a cluster's jobs.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
#include <string>

#include "client/cli/commands.hpp"
#include "client/cli/common.hpp"
#include "client/cli/follow.hpp"
#include "client/client.hpp"
#include "client/dashboard/views.hpp"

namespace loco::cli {
namespace {

int submit(const std::string& address, const std::string& file, bool detach,
           const std::string& entry, const std::vector<std::string>& sets,
           const std::string& resume) {
  install_signal_handlers();
  JobSpec spec = read_job(file, sets, resume, entry);
  Client client(head_address(address));
  JobHandle job = client.submit(spec);
  std::printf("submitted %s%s as job %s\n", spec.path.c_str(),
              resume.empty() ? "" : (" from " + resume).c_str(), job.id().c_str());
  std::fflush(stdout);
  if (detach) return 0;
  auto end = follow(job, true);
  if (!end) {
    std::printf("stopped following; job %s keeps running (loco cancel %s stops it)\n",
                job.id().c_str(), job.id().c_str());
    return 130;
  }
  return end->state == loco::JobState::succeeded ? 0 : 1;
}

void print_jobs(const std::vector<JobInfo>& jobs) {
  std::printf("%-18s %-20s %-12s %-10s %s\n", "JOB", "NAME", "OWNER", "STATE", "MESSAGE");
  for (const JobInfo& j : jobs)
    std::printf("%-18s %-20s %-12s %-10s %s\n", j.id.c_str(), j.name.c_str(),
                j.owner.empty() ? "(operator)" : j.owner_name.c_str(), to_string(j.state).c_str(),
                j.message.c_str());
}

int print_log(const std::string& address, const std::string& id, bool follow_it) {
  Client client(head_address(address));
  JobHandle job = client.job(id);
  if (follow_it) {
    install_signal_handlers();
    auto end = follow(job, false);
    return end && end->state == loco::JobState::succeeded ? 0 : 1;
  }
  for (const JobHandle::Update& u : job.updates_so_far())
    if (!u.report) std::printf("%s\n", u.line.c_str());
  return 0;
}

struct JobArgs {
  std::string address, file, id, entry, resume;
  std::vector<std::string> sets;
  bool detach = false, follow = false, json = false;
  int workers = 0;
};

}  // namespace

void add_job_commands(CLI::App& app, Commands& out) {
  auto a = std::make_shared<JobArgs>();
  auto* submit_cmd = app.add_subcommand("submit", "submit a job file and follow its progress");
  submit_cmd->add_option("file", a->file,
                         "job file (YAML); with --resume, the job.yaml beside the checkpoint "
                         "when not given");
  submit_cmd->add_option("--address", a->address, "head HOST:PORT");
  submit_cmd->add_flag("--detach", a->detach, "return once submitted");
  submit_cmd->add_option("--entry", a->entry,
                         "actor class that runs the job (default diloco.OuterAggregator)");
  submit_cmd->add_option("--set", a->sets,
                         "PATH=VALUE: set a field of the job file, e.g. --set inner.lr=3e-4 "
                         "--set workers.count=8 (repeatable; validated as the file is)")
      ->allow_extra_args(false);  // one value a --set: the job file after it stays the job file
  submit_cmd->add_option("--resume", a->resume,
                         "start from this checkpoint (a ckpt-round-N.pt or final.pt of any job, "
                         "or the simulator's): its outer state, round and the workers' inner "
                         "states beside it; needs nothing of the cluster that wrote it");
  out.push_back({submit_cmd, [a] {
                   return submit(a->address, a->file, a->detach, a->entry, a->sets, a->resume);
                 }});

  auto* jobs_cmd = app.add_subcommand("jobs", "list the cluster's jobs");
  jobs_cmd->add_option("--address", a->address, "head HOST:PORT");
  jobs_cmd->add_flag("--json", a->json, "as JSON (the dashboard's /api/jobs)");
  out.push_back({jobs_cmd, [a] {
                   Client client(head_address(a->address));
                   if (a->json)
                     std::printf("%s\n", dashboard::jobs_json(client.jobs(), {}).dump(2).c_str());
                   else
                     print_jobs(client.jobs());
                   return 0;
                 }});

  auto* logs_cmd = app.add_subcommand("logs", "print a job's log");
  logs_cmd->add_option("job", a->id, "job id")->required();
  logs_cmd->add_option("--address", a->address, "head HOST:PORT");
  logs_cmd->add_flag("-f,--follow", a->follow, "keep following until the job ends");
  out.push_back({logs_cmd, [a] { return print_log(a->address, a->id, a->follow); }});

  auto* cancel_cmd = app.add_subcommand("cancel", "cancel a job");
  cancel_cmd->add_option("job", a->id, "job id")->required();
  cancel_cmd->add_option("--address", a->address, "head HOST:PORT");
  out.push_back({cancel_cmd, [a] {
                   Client client(head_address(a->address));
                   JobInfo j = client.job(a->id).cancel();
                   std::printf("job %s %s\n", j.id.c_str(), to_string(j.state).c_str());
                   return 0;
                 }});

  auto* scale_cmd = app.add_subcommand("scale", "change the number of workers of a running job");
  scale_cmd->add_option("job", a->id, "job id")->required();
  scale_cmd->add_option("--workers", a->workers, "workers from the next round on")
      ->required()
      ->check(CLI::PositiveNumber);
  scale_cmd->add_option("--address", a->address, "head HOST:PORT");
  out.push_back({scale_cmd, [a] {
                   Client client(head_address(a->address));
                   JobInfo j = client.job(a->id).scale(a->workers);
                   std::printf("job %s: %d workers requested; they join at the next round\n",
                               j.id.c_str(), j.scale);
                   return 0;
                 }});
}

}  // namespace loco::cli
