#pragma once
// The dashboard's page and its script (served as / and /static/dashboard.js). The script
// builds the page with textContent only, never from HTML strings: job names and log lines
// come from the cluster.
#include <string>

namespace loco::dashboard {

const std::string& page_html();
const std::string& page_js();

}  // namespace loco::dashboard
