// loco plot: a job's loss curves and per-step figures as PNGs, drawn by gnuplot here, outside
// the job's actors. From the cluster (the job's log, as the dashboard reads it) or from a
// metrics.jsonl file. gnuplot runs from an argument vector (no shell) in the output folder,
// and its scripts are fixed text naming fixed files there: no string of a job file or of the
// cluster reaches a shell or gnuplot's language, which can run commands.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "client/cli/commands.hpp"
#include "client/cli/common.hpp"
#include "client/client.hpp"
#include "client/dashboard/views.hpp"
#include "client/process.hpp"
#include "diloco/data/bounded_json.hpp"
#include "diloco/job/job_schema.hpp"

namespace fs = std::filesystem;

namespace loco::cli {
namespace {

constexpr double kMissing = std::numeric_limits<double>::quiet_NaN();

// What the plots show.
struct PlotData {
  struct Round {
    double tokens = 0, train = kMissing, val = kMissing;
  };
  struct Step {
    int64_t step = 0;
    double loss = kMissing, grad_norm = kMissing, lr = kMissing, tokens_per_s = kMissing;
  };
  std::vector<Round> rounds;
  std::vector<Step> steps;
};

namespace schema = diloco::schema;

double number(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : kMissing;
}

// One inner step's figures, from a metrics.jsonl "steps" object or a row of the dashboard's:
// a figure it lacks is missing, not 0.
PlotData::Step step_of(int64_t step, const nlohmann::json& j) {
  schema::Step s{.loss = kMissing, .lr = kMissing, .grad_norm = kMissing};
  schema::read_json(j, s);
  return {step, s.loss, s.grad_norm, s.lr, s.tokens_per_s.value_or(kMissing)};
}

// From a metrics.jsonl that a job (or `loco train`) wrote.
PlotData from_metrics_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::invalid_argument("cannot read " + path);
  PlotData d;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    nlohmann::json j;
    try {
      j = diloco::parse_bounded_json(line, path + ":" + std::to_string(n));
    } catch (const std::runtime_error& e) {
      throw std::invalid_argument(e.what());
    }
    if (!j.is_object())
      throw std::invalid_argument(path + ":" + std::to_string(n) + ": not a JSON object");
    schema::MetricsLine l;
    l.train_loss = kMissing;
    schema::read_json(j, l);
    d.rounds.push_back({double(l.tokens_total), l.round > 0 ? l.train_loss : kMissing,
                        l.val_loss.value_or(kMissing)});
    // A job's line has the round's steps, which end at its "inner_steps".
    auto steps = j.find(schema::key(&schema::JobMetricsLine::steps));
    if (steps == j.end() || !steps->is_array()) continue;
    const int64_t first = l.inner_steps - int64_t(steps->size()) + 1;
    for (size_t i = 0; i < steps->size(); ++i)
      d.steps.push_back(step_of(first + int64_t(i), (*steps)[i]));
  }
  return d;
}

// From the cluster: the job's log, folded as the dashboard folds it.
PlotData from_cluster(const std::string& address, const std::string& job_id) {
  Client client(head_address(address));
  JobHandle job = client.job(job_id);
  (void)job.info();  // an unknown job fails here, naming it
  dashboard::JobHistory h;
  for (int polls = 0; polls < 10000; ++polls) {
    JobEvents ev = job.poll(h.cursor);
    if (ev.events.empty()) break;
    for (const JobEvent& e : ev.events) h.add(e);
  }
  const nlohmann::json j = dashboard::job_json(job.info(), h);
  PlotData d;
  for (const auto& r : j["rounds_done"]) {
    // The report's figures (a diverged loss, and round 0's, null: missing).
    schema::Report rep;
    rep.loss = kMissing;
    schema::read_json(r, rep);
    double x = number(r, dashboard::kTokens);
    if (std::isnan(x)) x = double(rep.inner_step);
    d.rounds.push_back({x, rep.loss, rep.val_loss.value_or(kMissing)});
  }
  for (const auto& s : j["steps"]) d.steps.push_back(step_of(s["step"].get<int64_t>(), s));
  return d;
}

std::string cell(double v) {
  if (std::isnan(v)) return "NaN";
  std::ostringstream s;
  s.precision(10);
  s << v;
  return s.str();
}

// Runs `gnuplot SCRIPT` in `dir` (bounded: 60 s). True when it exited 0.
bool gnuplot(const std::string& dir, const std::string& script) {
  Subprocess::Options o;
  o.cwd = dir;
  o.log_path = dir + "/gnuplot.log";
  Subprocess p({"gnuplot", script}, o);
  auto rc = p.wait(std::chrono::seconds(60));
  if (!rc) p.kill();
  return rc && *rc == 0;
}

int plot(const std::string& address, const std::string& job_id, const std::string& metrics,
         std::string out) {
  if (job_id.empty() == metrics.empty())
    throw std::invalid_argument("loco plot: give a JOB (read from the cluster) or --metrics FILE");
  PlotData d = metrics.empty() ? from_cluster(address, job_id) : from_metrics_file(metrics);
  if (out.empty()) out = metrics.empty() ? job_id : fs::path(metrics).parent_path().string();
  if (out.empty()) out = ".";
  fs::create_directories(out);
  {
    std::ofstream f(out + "/loss.dat");
    f << "# tokens train_loss val_loss\n";
    for (const auto& r : d.rounds)
      f << cell(r.tokens) << " " << cell(r.train) << " " << cell(r.val) << "\n";
    std::ofstream(out + "/loss.gp")
        << "set terminal pngcairo size 900,540\nset output 'loss.png'\n"
        << "set title 'DiLoCo: loss by tokens'\nset xlabel 'tokens'\nset ylabel 'loss'\n"
        << "set grid\nset datafile missing 'NaN'\n"
        << "plot 'loss.dat' using 1:2 with lines title 'train', "
        << "'loss.dat' using 1:3 with linespoints title 'validation'\n";
  }
  std::vector<std::string> wrote;
  if (!gnuplot(out, "loss.gp"))
    throw std::runtime_error("gnuplot failed or is not installed (gnuplot-nox); see " + out +
                             "/gnuplot.log; the data is in " + out + "/loss.dat");
  wrote.push_back(out + "/loss.png");
  if (!d.steps.empty()) {
    // gnuplot fails on a column without a number: tokens/s only when some step has it.
    bool any_rate = false;
    for (const auto& st : d.steps) any_rate = any_rate || !std::isnan(st.tokens_per_s);
    std::ofstream f(out + "/steps.dat");
    f << "# step loss grad_norm lr tokens_per_s\n";
    for (const auto& s : d.steps)
      f << s.step << " " << cell(s.loss) << " " << cell(s.grad_norm) << " " << cell(s.lr) << " "
        << cell(s.tokens_per_s) << "\n";
    f.close();
    std::ofstream(out + "/steps.gp")
        << "set terminal pngcairo size 900,900\nset output 'steps.png'\n"
        << "set datafile missing 'NaN'\nset grid\nset xlabel 'inner step'\n"
        << "set multiplot layout 3,1 title 'DiLoCo: per inner step (mean over the workers)'\n"
        << "plot 'steps.dat' using 1:2 with lines title 'loss'\n"
        << "plot 'steps.dat' using 1:3 with lines title 'gradient norm'\n"
        << (any_rate ? "set ytics nomirror\nset y2tics\n"
                       "plot 'steps.dat' using 1:4 with lines title 'learning rate', "
                       "'steps.dat' using 1:5 axes x1y2 with lines title 'tokens/s (right)'\n"
                     : "plot 'steps.dat' using 1:4 with lines title 'learning rate'\n")
        << "unset multiplot\n";
    if (!gnuplot(out, "steps.gp"))
      throw std::runtime_error("gnuplot failed on " + out + "/steps.gp; see " + out +
                               "/gnuplot.log");
    wrote.push_back(out + "/steps.png");
  }
  for (const auto& w : wrote) std::cout << "plot: " << w << "\n";
  return 0;
}

struct PlotArgs {
  std::string address, job, metrics, out;
};

}  // namespace

void add_plot_command(CLI::App& app, Commands& out) {
  auto a = std::make_shared<PlotArgs>();
  auto* cmd = app.add_subcommand(
      "plot",
      "a job's loss curves and per-step figures as PNGs (gnuplot), from the cluster or "
      "from a metrics.jsonl");
  cmd->add_option("job", a->job, "job id, read from the cluster");
  cmd->add_option("--metrics", a->metrics, "a metrics.jsonl instead of the cluster");
  cmd->add_option("--address", a->address, "head HOST:PORT");
  cmd->add_option("--out", a->out,
                  "folder for loss.png and steps.png (default: JOB, or the metrics file's)");
  out.push_back({cmd, [a] { return plot(a->address, a->job, a->metrics, a->out); }});
}

}  // namespace loco::cli
