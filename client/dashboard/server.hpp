#pragma once
// The dashboard: an HTTP server (cpp-httplib) that shows a cluster and its jobs in a web page,
// as JSON and in Prometheus' text format. It reads the cluster as any client does, through
// the head (Runtime::status, list_jobs, job_events), so it runs wherever a client key or the
// cluster key reaches the head: in the head's process (`loco start --head --dashboard-port`)
// or on its own (`loco dashboard`).
//
// Reads only: no endpoint changes anything. Loopback unless told otherwise; every data
// endpoint wants `Authorization: Bearer TOKEN` when a token is set (see docs/security.md).
#include <memory>
#include <string>

namespace loco::dashboard {

struct Options {
  std::string head_address;  // HOST:PORT of the head
  std::string host = "127.0.0.1";
  int port = 8265;  // 0: any free port
  // The read-only token; "" serves without one (an --insecure cluster).
  std::string token;
  // Chart.js, served as /static/chart.js; "" or missing: the page shows tables only.
  std::string chart_js_path;
};

// The file Debian's libjs-chart.js installs, where the build found it.
std::string default_chart_js_path();

// 128 random bits, hex: a token for Options::token.
std::string random_token();
// The token in `path` (its first line), made there with random_token() and mode 0600 if the
// file does not exist. Throws std::invalid_argument when it is shorter than 16 characters.
std::string load_or_make_token(const std::string& path);

// Pure checks, exposed for tests.
// Whether `header` (the Authorization header) carries `token`; compared in constant time.
bool token_matches(const std::string& header, const std::string& token);
// Whether a request's Host header names a loopback address: a dashboard bound to loopback
// answers only those, so that a web page elsewhere cannot read it through DNS rebinding.
bool is_loopback_host_header(const std::string& host);
bool is_loopback_bind(const std::string& host);

class Server {
 public:
  explicit Server(Options opts);
  ~Server();  // stops
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds (throws std::runtime_error naming the address when it cannot) and serves on a
  // thread of its own.
  void start();
  void stop();
  int port() const;
  // "http://HOST:PORT/", and "#token=..." when there is a token (the page reads it there,
  // so it stays out of the server's logs and of Referer headers).
  std::string url() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace loco::dashboard
