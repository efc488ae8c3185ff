// loco._native: the Python client's bindings (nanobind) over loco::Client and a job file's
// checks. Plain values cross the boundary (str, int, float, lists, dicts): the Python API in
// python/loco/ shapes them. Every call that waits on the cluster releases the GIL.
#include <nanobind/nanobind.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cmath>
#include <cstdlib>
#include <set>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "client/client.hpp"
#include "diloco/job/config.hpp"
#include "include/loco/version.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

nb::dict job_dict(const loco::JobInfo& j) {
  nb::dict d;
  d["id"] = j.id;
  d["name"] = j.name;
  d["state"] = loco::to_string(j.state);
  d["message"] = j.message;
  d["entry_actor"] = j.entry_actor;
  d["submitted_unix_ms"] = j.submitted_unix_ms;
  d["finished_unix_ms"] = j.finished_unix_ms;
  d["scale"] = j.scale;
  d["owner"] = j.owner;
  return d;
}

const std::set<std::string> kCounts = {"round", "rounds", "workers", "inner_step",
                                       "failed_attempts", "redo", "round_tokens", "late",
                                       "left_out", "left_out_total"};

// A job's event as Python sees it, decoded as the C++ client decodes it (JobHandle::decode):
// {"kind": "report", "round", "rounds", **figures}, {"kind": "log", "line"}; other kinds (the
// job's typed records) are left out.
nb::object event_object(const loco::JobEvent& e) {
  const std::optional<loco::JobHandle::Update> u = loco::JobHandle::decode(e);
  if (!u) return nb::none();
  nb::dict d;
  if (!u->report) {
    d["kind"] = "log";
    d["line"] = u->line;
    return d;
  }
  d["kind"] = "report";
  for (const auto& [k, v] : u->figures) {
    // Counts as ints (the report's map holds doubles): round, workers, inner_step, ...
    if (kCounts.count(k) && std::floor(v) == v && std::fabs(v) < 9.0e15)
      d[nb::str(k.c_str())] = static_cast<int64_t>(v);
    else
      d[nb::str(k.c_str())] = v;
  }
  if (!u->report->note.empty()) d["note"] = u->report->note;
  return d;
}

// One connection to a cluster's head.
class Session {
 public:
  Session(const std::string& address, double timeout_s) {
    loco::ConnectOptions o;
    o.timeout = loco::Millis(static_cast<int64_t>(timeout_s * 1000));
    client_ = std::make_unique<loco::Client>(address, o);
  }

  std::string submit(const std::string& text, const std::string& path, int max_workers) {
    loco::JobSpec spec = loco::JobSpec::from_yaml(text);
    spec.path = path;
    spec.max_workers = max_workers;
    return client_->submit(spec).id();
  }
  nb::dict job(const std::string& id) {
    loco::JobInfo j;
    {
      nb::gil_scoped_release unlocked;
      j = client_->job(id).info();
    }
    return job_dict(j);
  }
  // Events after `cursor` (at most `max`): (events, new cursor, the job's record).
  nb::tuple events(const std::string& id, std::string cursor, int max) {
    loco::JobEvents ev;
    {
      nb::gil_scoped_release unlocked;
      ev = client_->job(id).poll(cursor, max);
    }
    nb::list out;
    for (const loco::JobEvent& e : ev.events)
      if (nb::object o = event_object(e); !o.is_none()) out.append(o);
    return nb::make_tuple(out, cursor, job_dict(ev.job));
  }
  nb::dict scale(const std::string& id, int workers) {
    loco::JobInfo j;
    {
      nb::gil_scoped_release unlocked;
      j = client_->job(id).scale(workers);
    }
    return job_dict(j);
  }
  nb::dict cancel(const std::string& id) {
    loco::JobInfo j;
    {
      nb::gil_scoped_release unlocked;
      j = client_->job(id).cancel();
    }
    return job_dict(j);
  }
  nb::list jobs() {
    std::vector<loco::JobInfo> all;
    {
      nb::gil_scoped_release unlocked;
      all = client_->jobs();
    }
    nb::list out;
    for (const auto& j : all) out.append(job_dict(j));
    return out;
  }
  nb::dict status() {
    loco::ClusterStatus s;
    {
      nb::gil_scoped_release unlocked;
      s = client_->runtime().status();
    }
    nb::dict d;
    d["head_address"] = s.head_address;
    nb::list nodes;
    for (const auto& n : s.nodes) {
      nb::dict nd;
      nd["id"] = n.node.id;
      nd["address"] = n.node.address;
      nd["hostname"] = n.node.hostname;
      nd["state"] = loco::to_string(n.node.state);
      nd["resources"] = n.node.resources;
      nd["used"] = n.used;
      nodes.append(nd);
    }
    d["nodes"] = nodes;
    d["actors"] = s.actors.size();
    return d;
  }

 private:
  std::unique_ptr<loco::Client> client_;
};

// A job file as `loco submit` checks it: each "PATH=VALUE" of `sets` applied, then every field
// checked (ConfigError names the field). The text to submit, its name, its workers.max.
nb::tuple check_job(const std::string& text, const std::vector<std::string>& sets,
                    const std::string& path) {
  try {
    const std::string final_text = sets.empty() ? text : loco::diloco::with_overrides(text, sets);
    const loco::diloco::JobConfig cfg = loco::diloco::JobConfig::from_yaml(final_text);
    return nb::make_tuple(final_text, cfg.name, cfg.workers.max);
  } catch (const loco::diloco::ConfigError& e) {
    throw loco::diloco::ConfigError(path + ": " + e.what());
  }
}

}  // namespace

NB_MODULE(_native, m) {
  m.doc() = "loco's client, native part (use the loco package)";
  m.attr("version") = loco::kVersion;
  // loco::Error and its kinds as Python exceptions (the most specific is raised).
  static nb::exception<loco::Error> error(m, "Error", PyExc_RuntimeError);
  static nb::exception<loco::ClusterError> cluster(m, "ClusterError", error.ptr());
  static nb::exception<loco::TimeoutError> timeout(m, "TimeoutError", error.ptr());
  static nb::exception<loco::PermissionError> permission(m, "PermissionError", error.ptr());
  static nb::exception<loco::ActorDiedError> died(m, "ActorDiedError", error.ptr());
  static nb::exception<loco::ActorNotFoundError> not_found(m, "ActorNotFoundError", error.ptr());
  static nb::exception<loco::RemoteError> remote(m, "RemoteError", error.ptr());
  static nb::exception<loco::SchedulingError> scheduling(m, "SchedulingError", error.ptr());
  static nb::exception<loco::ProtocolError> protocol(m, "ProtocolError", error.ptr());
  static nb::exception<loco::diloco::ConfigError> config(m, "ConfigError", PyExc_ValueError);

  nb::class_<Session>(m, "Session")
      .def(nb::init<const std::string&, double>(), "address"_a, "timeout_s"_a,
           nb::call_guard<nb::gil_scoped_release>())
      .def("submit", &Session::submit, "text"_a, "path"_a, "max_workers"_a,
           nb::call_guard<nb::gil_scoped_release>())
      .def("job", &Session::job, "id"_a)
      .def("events", &Session::events, "id"_a, "cursor"_a, "max"_a = 1000)
      .def("scale", &Session::scale, "id"_a, "workers"_a)
      .def("cancel", &Session::cancel, "id"_a)
      .def("jobs", &Session::jobs)
      .def("status", &Session::status);
  m.def("check_job", &check_job, "text"_a, "sets"_a, "path"_a);
}
