#pragma once
// The dashboard as the `loco` commands start it: `loco dashboard`, `loco start --head
// --dashboard-port`, `loco up`.
#include <memory>
#include <string>

#include "client/dashboard/server.hpp"

namespace loco::cli {

// A dashboard for the head at `head_address`, not yet started. Its token: the one in
// `token_file` (made there if missing), else none for an --insecure cluster, else a random one.
std::unique_ptr<dashboard::Server> make_dashboard(const std::string& head_address,
                                                  const std::string& host, int port,
                                                  const std::string& token_file);

// Where `loco start --head` records the URL of the dashboard it serves (mode 0600: it holds
// the token), for `loco dashboard` to print.
std::string dashboard_url_file();

}  // namespace loco::cli
