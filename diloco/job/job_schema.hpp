// What a DiLoCo job reports and records, as typed structs, in one place: written by actors/
// (the aggregator's reports and step records, outer_aggregator.cpp; metrics.jsonl,
// job_records.cpp) and diloco/ (the simulator's metrics.jsonl), read by client/ (the
// dashboard's views and so /api and /metrics, `loco plot`, `loco jobs --json`, `loco submit`'s
// RoundReport).
//
// Each struct lists its fields once, in `fields`: the key, the member, and how it reads and
// writes when it is not a plain number. From that one list come its metrics map
// (JobProgress::metrics: to_metrics, from_metrics), its JSON (to_json, from_json) and a field's
// key (key(&Report::loss)). A key written in one place and read in another cannot drift apart:
// both go through the same list.
//
// Header only, torch-free, with no loco include: client/ (no LibTorch, no link to diloco/)
// includes it.
#pragma once

#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace loco::diloco::schema {

// Kinds of a job's typed records in its event log (Runtime::job_record), besides the runtime's
// own "report" (a JobProgress: Report) and "log" (a line).
namespace record {
// A round's per-step figures: msgpack of std::vector<JobProgress>, step = the job's inner step,
// metrics a Step's (to_metrics). At most 500 a round.
inline constexpr char kSteps[] = "steps";
// A checkpoint the job wrote: msgpack of [path, round].
inline constexpr char kCheckpoint[] = "checkpoint";
// compression auto's change of codec: msgpack [text, round] (actors/messages.hpp LineRecord).
inline constexpr char kCodec[] = "codec";
// A worker joined after the job's start (not a rewind's reload on the same node): msgpack
// [text, round], as kCodec's.
inline constexpr char kJoin[] = "join";
// A worker left the job (lost, failed, scaled down or removed by the guard): msgpack
// [text, round], as kJoin's.
inline constexpr char kLeft[] = "left";
}  // namespace record

// JobProgress::metrics (runtime/core/cluster_types.hpp, which diloco/ does not include; the
// readers check that the two are the same type).
using Metrics = std::map<std::string, double>;

// How a field is written and read, beside its C++ type. An optional without a value is absent
// from a metrics map either way.
enum class Form {
  plain,    // an optional without a value: JSON null
  omitted,  // an optional without a value: no key in JSON
  hex,      // an unsigned integer as a lowercase hex string, without "0x"
};

// A round's report: JobProgress::metrics of the aggregator's "report" events (step = the round,
// total = the rounds to run). The dashboard's /api/jobs/ID gives each as a field of the round's
// "rounds_done" row, and /metrics the newest as loco_job_*. Other entry actors' reports may
// carry some of these only: from_metrics leaves the others at their defaults, and `find` tells
// whether a report has a field.
struct Report {
  int64_t inner_step = 0;          // inner steps per worker so far
  double loss = 0;                 // mean training loss of the round's steps
  std::optional<double> val_loss;  // only when evaluated this round
  std::optional<double> val_ppl;   // exp(val_loss), with it
  double tokens_per_s = 0;         // all workers together
  // All-reduce bytes sent per worker, cumulative: over θ's history, and over every attempt
  // (failed ones and undone rounds included).
  uint64_t bytes_per_worker = 0;
  uint64_t job_bytes_per_worker = 0;
  int failed_attempts = 0;   // of this round
  int64_t redo = 0;          // times the job went back
  double utilization = 0;    // inner-step time / wall time, 0..1
  int workers = 0;           // the round's members
  std::optional<int> late;   // members that missed the deadline; absent when none
  std::optional<int> left_out;           // members the guard left out; absent when none
  std::optional<double> left_out_total;  // over the job: rounds × members left out
  int64_t round_tokens = 0;  // the round's members' tokens
  double round_time = 0;     // seconds of the round
  double job_time = 0;       // seconds since the job was submitted
  double allreduce_seconds_total = 0;

  friend bool operator==(const Report&, const Report&) = default;

  template <class F>
  static constexpr void fields(F&& f) {
    f("inner_step", &Report::inner_step);
    f("loss", &Report::loss);
    f("val_loss", &Report::val_loss);
    f("val_ppl", &Report::val_ppl);
    f("tokens_per_s", &Report::tokens_per_s);
    f("bytes_per_worker", &Report::bytes_per_worker);
    f("job_bytes_per_worker", &Report::job_bytes_per_worker);
    f("failed_attempts", &Report::failed_attempts);
    f("redo", &Report::redo);
    f("utilization", &Report::utilization);
    f("workers", &Report::workers);
    f("late", &Report::late);
    f("left_out", &Report::left_out);
    f("left_out_total", &Report::left_out_total);
    f("round_tokens", &Report::round_tokens);
    f("round_time", &Report::round_time);
    f("job_time", &Report::job_time);
    f("allreduce_seconds_total", &Report::allreduce_seconds_total);
  }
};

// One inner step's figures over the round's members: the metrics of a "steps" record and the
// objects of metrics.jsonl's "steps" (where every field is written, null when absent).
struct Step {
  double loss = 0;                     // mean
  double lr = 0;                       // mean
  double grad_norm = 0;                // mean
  std::optional<int64_t> tokens;       // sum (metrics.jsonl only)
  std::optional<double> tokens_per_s;  // all members
  std::optional<double> tflops;        // model TFLOP/s, all members
  std::optional<double> mfu;           // mean model FLOPs utilization, 0..1 (a peak known)
  std::optional<double> memory_gb;     // the most device memory, GB (GPUs)
  std::optional<double> cpu_s;         // mean CPU seconds (metrics.jsonl only)

  friend bool operator==(const Step&, const Step&) = default;

  template <class F>
  static constexpr void fields(F&& f) {
    f("loss", &Step::loss);
    f("lr", &Step::lr);
    f("grad_norm", &Step::grad_norm);
    f("tokens", &Step::tokens);
    f("tokens_per_s", &Step::tokens_per_s);
    f("tflops", &Step::tflops);
    f("mfu", &Step::mfu);
    f("memory_gb", &Step::memory_gb);
    f("cpu_s", &Step::cpu_s);
  }
};

// One line of metrics.jsonl as the simulator (`loco train`, loco-train) writes it, and the
// first fields of a job's (JobMetricsLine): one round. Tokens, bytes and seconds are cumulative
// over the rounds so far. diloco::RoundMetrics (metrics.hpp).
// A worker the guard left out of one of the round's averages (diloco/round/guard.hpp).
struct LeftOutLine {
  int worker = 0;
  int fragment = 0;  // blocking rounds: 0
  std::string rule;  // "malformed", "abstained", "non-finite", "norm", "direction"
  std::string why;

  friend bool operator==(const LeftOutLine&, const LeftOutLine&) = default;

  template <class F>
  static constexpr void fields(F&& f) {
    f("worker", &LeftOutLine::worker);
    f("fragment", &LeftOutLine::fragment);
    f("rule", &LeftOutLine::rule);
    f("why", &LeftOutLine::why);
  }
};

// What happened to the cluster itself while the round ran (the head's kClusterRecord in the
// job's events: the head started, its Redis came back, the relay went away or came back).
struct ClusterLine {
  int64_t unix_ms = 0;  // when the head wrote it
  std::string what;     // "head", "redis", "relay"
  std::string text;

  friend bool operator==(const ClusterLine&, const ClusterLine&) = default;

  template <class F>
  static constexpr void fields(F&& f) {
    f("unix_ms", &ClusterLine::unix_ms);
    f("kind", &ClusterLine::what);
    f("text", &ClusterLine::text);
  }
};

// The codec a fragment's operation ran (sync.mode streaming and eager, compression auto: its
// members agreed on it as it began; diloco/round/codec_plan.hpp).
struct FragmentCodecLine {
  int round = 0;  // the round it synchronized in, as logs count
  int fragment = 0;
  std::string codec;
  std::optional<std::string> reason;  // where it is another codec than the operation before

  friend bool operator==(const FragmentCodecLine&, const FragmentCodecLine&) = default;

  template <class F>
  static constexpr void fields(F&& f) {
    f("round", &FragmentCodecLine::round);
    f("fragment", &FragmentCodecLine::fragment);
    f("codec", &FragmentCodecLine::codec);
    f("reason", &FragmentCodecLine::reason, Form::omitted);
  }
};

struct MetricsLine {
  int round = 0;            // rounds done (baselines: H-step segments done)
  int64_t inner_steps = 0;  // per worker
  int64_t tokens_per_worker = 0;
  int64_t tokens_total = 0;        // over all workers
  double train_loss = 0;           // mean over the round's steps and workers
  std::optional<double> val_loss;  // when evaluated this round
  uint64_t bytes_per_worker = 0;   // sent by each worker, all-reduce model of averager.hpp
  double seconds = 0;  // wall time since start (this process; a job: see actors/job_records.hpp)
  uint64_t theta_hash = 0;
  std::optional<std::vector<LeftOutLine>> left_out;  // the guard's, when it left someone out
  // The simulator: how close the members averaged came to the guard's bounds (GuardLog::Margins).
  std::optional<double> guard_norm_ratio;
  std::optional<double> guard_agreement;
  // compression auto (or the simulator's --codec-trace): the round's codec ("fp32", "int8",
  // "topk:64") and why it was chosen. The simulator replays a job's "codec"s.
  std::optional<std::string> codec;
  std::optional<std::string> codec_reason;
  // sync.mode streaming and eager: the codecs of the operations agreed since the line before
  // (an operation in flight as a round ends is in the next line). The simulator replays them.
  std::optional<std::vector<FragmentCodecLine>> fragment_codecs;
  std::optional<std::vector<ClusterLine>> cluster;  // a job's: what the cluster went through

  friend bool operator==(const MetricsLine&, const MetricsLine&) = default;

  template <class F>
  static constexpr void fields(F&& f) {
    f("round", &MetricsLine::round);
    f("inner_steps", &MetricsLine::inner_steps);
    f("tokens", &MetricsLine::tokens_per_worker);
    f("tokens_total", &MetricsLine::tokens_total);
    f("train_loss", &MetricsLine::train_loss);
    f("val_loss", &MetricsLine::val_loss);
    f("bytes", &MetricsLine::bytes_per_worker);
    f("time", &MetricsLine::seconds);
    f("theta_hash", &MetricsLine::theta_hash, Form::hex);
    f("left_out", &MetricsLine::left_out, Form::omitted);
    f("guard_norm_ratio", &MetricsLine::guard_norm_ratio, Form::omitted);
    f("guard_agreement", &MetricsLine::guard_agreement, Form::omitted);
    f("codec", &MetricsLine::codec, Form::omitted);
    f("codec_reason", &MetricsLine::codec_reason, Form::omitted);
    f("fragment_codecs", &MetricsLine::fragment_codecs, Form::omitted);
    f("cluster", &MetricsLine::cluster, Form::omitted);
  }
  // {"round":..,"inner_steps":..,"tokens":..,"tokens_total":..,"train_loss":..,
  //  "val_loss":..|null,"bytes":..,"time":..,"theta_hash":"<hex>"}
  std::string to_json() const;
};

// One member's part in a job's round (metrics.jsonl "members").
struct Member {
  int worker = 0;
  int steps = 0;
  int64_t tokens = 0;
  double seconds = 0;      // in inner steps
  double cpu_seconds = 0;  // its process's CPU time in those steps
  double wait = 0;         // the rest of the round: on the others, the network, the aggregator
  // Of cpu_seconds, its stepping thread's (the rest: the process's other threads, e.g. the
  // collective's while fragments are on the wire). 0 from a worker that does not report it.
  double step_cpu_seconds = 0;

  friend bool operator==(const Member&, const Member&) = default;

  template <class F>
  static constexpr void fields(F&& f) {
    f("worker", &Member::worker);
    f("steps", &Member::steps);
    f("tokens", &Member::tokens);
    f("seconds", &Member::seconds);
    f("cpu_seconds", &Member::cpu_seconds);
    f("wait", &Member::wait);
    f("step_cpu_seconds", &Member::step_cpu_seconds);
  }
};

// A job's line of metrics.jsonl: the simulator's fields, then the job's (what each means:
// actors/job_records.hpp). "members", "late" and "steps" are there for rounds 1.. only.
struct JobMetricsLine : MetricsLine {
  double utilization = 0;
  int workers = 0;
  uint64_t round_bytes = 0;
  double round_time = 0;
  int failed_attempts = 0;
  int64_t redo = 0;
  uint64_t job_bytes = 0;
  double job_time = 0;
  std::optional<std::vector<Member>> members;
  std::optional<std::vector<int>> late;
  std::optional<std::vector<Step>> steps;  // the round's, in order
  std::optional<double> guard_time;        // seconds in the guard's summary exchanges (a member's)

  friend bool operator==(const JobMetricsLine&, const JobMetricsLine&) = default;

  template <class F>
  static constexpr void fields(F&& f) {
    MetricsLine::fields(f);
    f("utilization", &JobMetricsLine::utilization);
    f("workers", &JobMetricsLine::workers);
    f("round_bytes", &JobMetricsLine::round_bytes);
    f("round_time", &JobMetricsLine::round_time);
    f("failed_attempts", &JobMetricsLine::failed_attempts);
    f("redo", &JobMetricsLine::redo);
    f("job_bytes", &JobMetricsLine::job_bytes);
    f("job_time", &JobMetricsLine::job_time);
    f("members", &JobMetricsLine::members, Form::omitted);
    f("late", &JobMetricsLine::late, Form::omitted);
    f("steps", &JobMetricsLine::steps, Form::omitted);
    f("guard_time", &JobMetricsLine::guard_time, Form::omitted);
  }
};

// The codec, for any struct with a `fields` list. Not for use on its own.
namespace codec {

template <class T>
struct is_optional : std::false_type {};
template <class T>
struct is_optional<std::optional<T>> : std::true_type {};
template <class T>
struct is_vector : std::false_type {};
template <class T, class A>
struct is_vector<std::vector<T, A>> : std::true_type {};

struct Probe {
  template <class M>
  constexpr void operator()(const char*, M, Form = Form::plain) const {}
};

template <class T>
concept Record = requires {
  T::fields(Probe{});
};

// A number of a metrics map or of JSON as V: an integer saturates, NaN is 0 (a float-to-integer
// conversion out of range is undefined; the figures come from the network).
template <class V>
V from_double(double v) {
  if constexpr (std::is_floating_point_v<V>) {
    return V(v);
  } else {
    if (std::isnan(v)) return 0;
    if (v <= double(std::numeric_limits<V>::min())) return std::numeric_limits<V>::min();
    if (v >= double(std::numeric_limits<V>::max())) return std::numeric_limits<V>::max();
    return V(v);
  }
}

template <class Json, class V>
Json write(const V& v, Form form);

template <class Json, Record T>
Json write_record(const T& x) {
  Json j = Json::object();
  T::fields([&](const char* name, auto member, Form form = Form::plain) {
    using V = std::remove_cvref_t<decltype(x.*member)>;
    if constexpr (is_optional<V>::value) {
      if (x.*member)
        j[name] = write<Json>(*(x.*member), form);
      else if (form != Form::omitted)
        j[name] = nullptr;
    } else {
      j[name] = write<Json>(x.*member, form);
    }
  });
  return j;
}

template <class Json, class V>
Json write(const V& v, Form form) {
  if constexpr (Record<V>) {
    return write_record<Json>(v);
  } else if constexpr (is_vector<V>::value) {
    Json a = Json::array();
    for (const auto& e : v) a.push_back(write<Json>(e, Form::plain));
    return a;
  } else if constexpr (std::is_unsigned_v<V>) {
    if (form != Form::hex) return Json(v);
    char buf[2 * sizeof(V) + 1];
    const auto r = std::to_chars(buf, buf + sizeof buf, v, 16);
    return Json(std::string(buf, r.ptr));
  } else {
    return Json(v);  // a number (NaN and infinities dump as null) or a string
  }
}

// Reads `v` from `j` where `j` holds one of its kind, and says whether it did; else `v` stays
// as it is. A plain double read from null is NaN: that is how a non-finite number is written.
template <class Json, class V>
bool read(const Json& j, V& v, Form form);

template <class Json, Record T>
bool read_record(const Json& j, T& x) {
  if (!j.is_object()) return false;
  T::fields([&](const char* name, auto member, Form form = Form::plain) {
    auto it = j.find(name);
    if (it == j.end()) return;
    using V = std::remove_cvref_t<decltype(x.*member)>;
    if constexpr (is_optional<V>::value) {
      typename V::value_type v{};
      if (!it->is_null() && read(*it, v, form)) x.*member = std::move(v);
    } else {
      read(*it, x.*member, form);
    }
  });
  return true;
}

template <class Json, class V>
bool read(const Json& j, V& v, Form form) {
  if constexpr (Record<V>) {
    return read_record(j, v);
  } else if constexpr (is_vector<V>::value) {
    if (!j.is_array()) return false;
    v.clear();
    for (const auto& e : j) {
      typename V::value_type x{};  // one for each element, read or not: positions matter
      read(e, x, Form::plain);
      v.push_back(std::move(x));
    }
    return true;
  } else if constexpr (std::is_same_v<V, std::string>) {
    if (!j.is_string()) return false;
    v = j.template get<std::string>();
    return true;
  } else if constexpr (std::is_floating_point_v<V>) {
    if (j.is_number())
      v = j.template get<V>();
    else if (j.is_null())
      v = std::numeric_limits<V>::quiet_NaN();
    else
      return false;
    return true;
  } else {
    static_assert(std::is_integral_v<V>, "a field is a number, a string, a vector or a record");
    if (form == Form::hex) {
      if (!j.is_string()) return false;
      const std::string s = j.template get<std::string>();
      V out{};
      const auto r = std::from_chars(s.data(), s.data() + s.size(), out, 16);
      if (r.ec != std::errc() || r.ptr != s.data() + s.size()) return false;
      v = out;
    } else if (j.is_number_integer()) {
      v = j.template get<V>();
    } else if (j.is_number()) {
      v = from_double<V>(j.template get<double>());
    } else {
      return false;
    }
    return true;
  }
}

}  // namespace codec

// The struct's fields that hold a value, as a metrics map (numbers only).
template <codec::Record T>
Metrics to_metrics(const T& x) {
  Metrics m;
  T::fields([&](const char* name, auto member, Form = Form::plain) {
    using V = std::remove_cvref_t<decltype(x.*member)>;
    if constexpr (codec::is_optional<V>::value) {
      static_assert(std::is_arithmetic_v<typename V::value_type>, "a metric is a number");
      if (x.*member) m[name] = double(*(x.*member));
    } else {
      static_assert(std::is_arithmetic_v<V>, "a metric is a number");
      m[name] = double(x.*member);
    }
  });
  return m;
}

// The fields a metrics map has; the others keep their defaults (optionals: none). Keys it does
// not know are not read.
template <codec::Record T>
T from_metrics(const Metrics& m) {
  T x;
  T::fields([&](const char* name, auto member, Form = Form::plain) {
    auto it = m.find(name);
    if (it == m.end()) return;
    using V = std::remove_cvref_t<decltype(x.*member)>;
    if constexpr (codec::is_optional<V>::value)
      x.*member = codec::from_double<typename V::value_type>(it->second);
    else
      x.*member = codec::from_double<V>(it->second);
  });
  return x;
}

// As a JSON object, the fields in the list's order where Json keeps an order
// (nlohmann::ordered_json): numbers as their C++ type writes them (an integer without ".0"),
// an optional without a value null or, Form::omitted, no key.
template <class Json = nlohmann::json, codec::Record T>
Json to_json(const T& x) {
  return codec::write_record<Json>(x);
}

// From a JSON object: the fields it has with a value of their kind; the others keep their
// defaults. Not an object: all defaults.
template <codec::Record T, class Json>
T from_json(const Json& j) {
  T x;
  codec::read_record(j, x);
  return x;
}

// As from_json, into `x`: the fields `j` lacks keep the values `x` has (a reader's own "not
// there", NaN say, instead of 0).
template <codec::Record T, class Json>
void read_json(const Json& j, T& x) {
  codec::read_record(j, x);
}

// The key of a field: key(&Report::loss) is "loss". A member not in T's list does not compile
// where a constant is needed, and throws otherwise.
template <class T, class V>
constexpr const char* key(V T::*member) {
  const char* out = nullptr;
  T::fields([&](const char* name, auto m, Form = Form::plain) {
    if constexpr (std::is_same_v<decltype(m), V T::*>) {
      if (m == member) out = name;
    }
  });
  if (out == nullptr) throw std::logic_error("not a field of its struct's list");
  return out;
}

// The keys of T's fields, in order.
template <codec::Record T>
std::vector<std::string> keys() {
  std::vector<std::string> out;
  T::fields([&](const char* name, auto, Form = Form::plain) { out.push_back(name); });
  return out;
}

// One field as a metrics map has it, the number as it is: none when the map lacks it (a report
// of another entry actor, or a figure not measured).
template <class T, class V>
std::optional<double> find(const Metrics& m, V T::*member) {
  auto it = m.find(key(member));
  return it == m.end() ? std::nullopt : std::optional<double>(it->second);
}

inline std::string MetricsLine::to_json() const {
  // nlohmann::ordered_json keeps the fields in the order people read them.
  return schema::to_json<nlohmann::ordered_json>(*this).dump();
}

}  // namespace loco::diloco::schema
