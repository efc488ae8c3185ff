#include "client/dashboard/server.hpp"

#include <httplib.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "client/dashboard/page.hpp"
#include "client/dashboard/views.hpp"
#include "runtime/core/errors.hpp"
#include "runtime/core/runtime.hpp"

namespace loco::dashboard {

std::string default_chart_js_path() { return LOCO_CHART_JS_PATH; }

std::string random_token() {
  std::random_device rd;  // /dev/urandom on Linux
  const char* hex = "0123456789abcdef";
  std::string out;
  for (int i = 0; i < 32; ++i) out += hex[rd() % 16];
  return out;
}

std::string load_or_make_token(const std::string& path) {
  if (!std::filesystem::exists(path)) {
    const mode_t old = ::umask(077);
    std::ofstream(path) << random_token() << "\n";
    ::umask(old);
  }
  std::ifstream f(path);
  std::string token;
  if (!f || !std::getline(f, token))
    throw std::invalid_argument("cannot read the dashboard token file " + path);
  if (token.size() < 16)
    throw std::invalid_argument("the dashboard token in " + path +
                                " is shorter than 16 characters");
  return token;
}

bool token_matches(const std::string& header, const std::string& token) {
  const std::string prefix = "Bearer ";
  if (token.empty() || header.size() != prefix.size() + token.size() ||
      header.compare(0, prefix.size(), prefix) != 0)
    return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < token.size(); ++i) diff |= header[prefix.size() + i] ^ token[i];
  return diff == 0;
}

namespace {
// 127.x.y.z written as an address, not a name that starts so ("127.0.0.1.example.com").
bool is_loopback_ipv4(const std::string& s) {
  if (s.rfind("127.", 0) != 0) return false;
  int dots = 0;
  for (char c : s) {
    if (c == '.')
      ++dots;
    else if (c < '0' || c > '9')
      return false;
  }
  return dots == 3 && s.back() != '.';
}
}  // namespace

bool is_loopback_host_header(const std::string& host) {
  std::string name = host;
  if (!name.empty() && name[0] == '[') {
    name = name.substr(0, name.find(']') + 1);
  } else if (auto colon = name.rfind(':'); colon != std::string::npos) {
    name = name.substr(0, colon);
  }
  return name == "localhost" || name == "[::1]" || is_loopback_ipv4(name);
}

bool is_loopback_bind(const std::string& host) {
  return host == "localhost" || host == "::1" || is_loopback_ipv4(host);
}

struct Server::Impl {
  Options opts;
  httplib::Server http;
  std::thread thread;
  std::atomic<bool> listen_returned{false};
  int port = 0;
  std::string chart_js;

  // What the dashboard has read of the cluster; one request at a time talks to the head.
  std::mutex mu;
  std::optional<Runtime> rt;
  std::map<std::string, JobHistory> histories;
  std::map<std::string, bool> complete;  // job id -> its log was read to its end after it ended

  Runtime& runtime() {
    if (!rt) {
      ConnectOptions c;
      c.timeout = Millis(3000);
      rt = Runtime::connect(opts.head_address, c);
    }
    return *rt;
  }

  // Reads what a job's log holds beyond what was read before (bounded per request).
  void refresh(const JobInfo& j) {
    if (complete[j.id]) return;
    JobHistory& h = histories[j.id];
    for (int polls = 0; polls < 200; ++polls) {
      JobEvents ev = runtime().job_events(j.id, h.cursor, 1000);
      for (const JobEvent& e : ev.events) h.add(e);
      if (ev.events.empty()) {
        complete[j.id] = ev.job.finished();
        return;
      }
    }
  }

  // The jobs this dashboard's key may read, their logs read on: a client key's own (another
  // user's job is left out, where before the head's refusal to read its log made the whole
  // page a 503), an admin's or the cluster key's every job.
  std::vector<JobInfo> refresh_jobs() {
    std::vector<JobInfo> readable;
    const std::vector<JobInfo> listed = runtime().list_jobs();
    // Jobs the head no longer lists (expired after `job_retention_ms`): their histories go.
    std::erase_if(histories, [&](const auto& kv) {
      return std::none_of(listed.begin(), listed.end(),
                          [&](const JobInfo& j) { return j.id == kv.first; });
    });
    std::erase_if(complete, [&](const auto& kv) { return !histories.count(kv.first); });
    for (const JobInfo& j : listed) {
      try {
        refresh(j);
      } catch (const PermissionError&) {
        continue;
      }
      readable.push_back(j);
    }
    return readable;
  }

  // Runs `fn` against the head; when the head cannot be reached, a 503 that says why, and the
  // next request connects again.
  template <class F>
  void answer(httplib::Response& res, F&& fn) {
    std::lock_guard lock(mu);
    try {
      fn();
    } catch (const ActorNotFoundError& e) {
      res.status = 404;
      res.set_content(nlohmann::json({{"error", e.what()}}).dump(), "application/json");
    } catch (const PermissionError& e) {
      res.status = 403;  // another user's job: the head answered, the key may not read it
      res.set_content(nlohmann::json({{"error", e.what()}}).dump(), "application/json");
    } catch (const std::exception& e) {
      rt.reset();
      res.status = 503;
      res.set_content(
          nlohmann::json({{"error", std::string("cannot read the cluster from the head at ") +
                                        opts.head_address + ": " + e.what()}})
              .dump(),
          "application/json");
    }
  }

  static void json_reply(httplib::Response& res, const nlohmann::json& j) {
    res.set_content(j.dump(), "application/json");
  }

  void routes() {
    http.set_payload_max_length(4096);  // GET only
    http.set_read_timeout(5, 0);
    http.set_write_timeout(5, 0);
    http.set_default_headers(
        {{"Cache-Control", "no-store"},
         {"X-Content-Type-Options", "nosniff"},
         {"Referrer-Policy", "no-referrer"},
         {"Content-Security-Policy",
          "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
          "frame-ancestors 'none'"}});
    const bool loopback = is_loopback_bind(opts.host);
    http.set_pre_routing_handler(
        [this, loopback](const httplib::Request& req, httplib::Response& res) {
          if (req.method != "GET" && req.method != "HEAD") {
            res.status = 405;
            res.set_content("the dashboard only reads\n", "text/plain");
            return httplib::Server::HandlerResponse::Handled;
          }
          if (loopback && !is_loopback_host_header(req.get_header_value("Host"))) {
            res.status = 403;
            res.set_content("this dashboard answers only requests for a loopback address\n",
                            "text/plain");
            return httplib::Server::HandlerResponse::Handled;
          }
          const bool data = req.path.rfind("/api/", 0) == 0 || req.path == "/metrics";
          if (data && !opts.token.empty() &&
              !token_matches(req.get_header_value("Authorization"), opts.token)) {
            res.status = 401;
            res.set_header("WWW-Authenticate", "Bearer realm=\"loco\"");
            res.set_content(
                "this dashboard wants Authorization: Bearer TOKEN (the token is in the "
                "URL that `loco dashboard` prints, after #token=)\n",
                "text/plain");
            return httplib::Server::HandlerResponse::Handled;
          }
          return httplib::Server::HandlerResponse::Unhandled;
        });
    http.Get("/", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(page_html(), "text/html; charset=utf-8");
    });
    http.Get("/static/dashboard.js", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(page_js(), "text/javascript; charset=utf-8");
    });
    http.Get("/static/chart.js", [this](const httplib::Request&, httplib::Response& res) {
      if (chart_js.empty()) {
        res.status = 404;
        return;
      }
      res.set_content(chart_js, "text/javascript; charset=utf-8");
    });
    http.Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("ok\n", "text/plain");
    });
    http.Get("/api/cluster", [this](const httplib::Request&, httplib::Response& res) {
      answer(res, [&] { json_reply(res, cluster_json(runtime().status())); });
    });
    http.Get("/api/jobs", [this](const httplib::Request&, httplib::Response& res) {
      answer(res, [&] { json_reply(res, jobs_json(refresh_jobs(), histories)); });
    });
    http.Get(R"(/api/jobs/([A-Za-z0-9._-]{1,128}))",
             [this](const httplib::Request& req, httplib::Response& res) {
               answer(res, [&] {
                 const std::string id = req.matches[1];
                 std::optional<Since> since;
                 if (req.has_param("since")) {
                   since = Since::parse(req.get_param_value("since"));
                   if (!since) {
                     res.status = 400;
                     json_reply(res, {{"error",
                                       "since: expected the cursor of an earlier answer "
                                       "(REVISION:ROUND:STEP:LINES:TIMELINE, at most 100 "
                                       "bytes)"}});
                     return;
                   }
                 }
                 for (const JobInfo& j : runtime().list_jobs())
                   if (j.id == id) {
                     refresh(j);
                     json_reply(res, job_json(j, histories[id], since));
                     return;
                   }
                 res.status = 404;
                 json_reply(res, {{"error", "no job " + id}});
               });
             });
    http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      answer(res, [&] {
        ClusterStatus st = runtime().status();
        std::vector<JobInfo> jobs = refresh_jobs();
        res.set_content(prometheus_text(st, jobs, histories), "text/plain; version=0.0.4");
      });
    });
  }
};

Server::Server(Options opts) : impl_(std::make_unique<Impl>()) {
  impl_->opts = std::move(opts);
  if (!impl_->opts.chart_js_path.empty()) {
    std::ifstream f(impl_->opts.chart_js_path);
    std::stringstream ss;
    ss << f.rdbuf();
    impl_->chart_js = ss.str();
  }
  impl_->routes();
}

Server::~Server() { stop(); }

void Server::start() {
  Impl& m = *impl_;
  if (m.opts.port == 0) {
    m.port = m.http.bind_to_any_port(m.opts.host);
  } else {
    m.port = m.http.bind_to_port(m.opts.host, m.opts.port) ? m.opts.port : -1;
  }
  if (m.port <= 0)
    throw std::runtime_error("the dashboard cannot listen at " + m.opts.host + ":" +
                             std::to_string(m.opts.port) +
                             " (in use? --dashboard-port / --port picks another, 0 any free)");
  m.thread = std::thread([&m] {
    m.http.listen_after_bind();
    m.listen_returned = true;
  });
  // httplib's stop() does nothing before its loop runs, and the loop would then run forever:
  // return only once it runs (or has given up), so that stop() always ends it.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!m.http.is_running() && !m.listen_returned && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (!m.http.is_running()) {
    stop();
    throw std::runtime_error("the dashboard's HTTP server did not start at " + m.opts.host + ":" +
                             std::to_string(m.port));
  }
}

void Server::stop() {
  if (!impl_) return;
  impl_->http.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

int Server::port() const { return impl_->port; }

std::string Server::url() const {
  const std::string& h = impl_->opts.host;
  std::string host = h == "0.0.0.0" ? "127.0.0.1" : h;
  if (host.find(':') != std::string::npos) host = "[" + host + "]";
  std::string u = "http://" + host + ":" + std::to_string(impl_->port) + "/";
  if (!impl_->opts.token.empty()) u += "#token=" + impl_->opts.token;
  return u;
}

}  // namespace loco::dashboard
