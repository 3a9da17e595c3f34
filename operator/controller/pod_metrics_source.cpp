#include "operator/controller/pod_metrics_source.h"

#include <httplib.h>

#include <algorithm>

#include "common/logging.h"
#include "common/prometheus_text.h"

namespace tandem::controller {
namespace {

using nlohmann::json;

std::optional<std::string> httpGet(httplib::Client& client, const std::string& path) {
  client.set_connection_timeout(0, 500000);
  client.set_read_timeout(2, 0);
  auto response = client.Get(path);
  if (!response || response->status != 200) return std::nullopt;
  return response->body;
}

std::string podName(const json& pod) {
  return pod.contains("metadata") ? pod["metadata"].value("name", "") : "";
}

class PodScrapeSource : public PodMetricsSource {
 public:
  std::map<std::string, std::string> scrape(const std::vector<json>& pods,
                                            const planner::MetricNames&) override {
    std::map<std::string, std::string> texts;
    for (const json& pod : pods) {
      const auto address = podMetricsAddress(pod);
      if (!address) continue;
      // Host and port apart: a URL would need an IPv6 address in brackets.
      httplib::Client client(address->first, address->second);
      if (std::optional<std::string> text = httpGet(client, "/metrics")) {
        texts[podName(pod)] = std::move(*text);
      } else {
        const bool ipv6 = address->first.find(':') != std::string::npos;
        TANDEM_LOG(kWarn) << "controller: planner: no /metrics from pod " << podName(pod) << " ("
                          << (ipv6 ? "[" + address->first + "]" : address->first) << ":"
                          << address->second << "); left out of this round";
      }
    }
    return texts;
  }
  std::string describe() const override { return "pods"; }
};

class FederationSource : public PodMetricsSource {
 public:
  FederationSource(std::string url, std::string pod_label)
      : url_(std::move(url)), pod_label_(std::move(pod_label)) {
    while (url_.ends_with('/')) url_.pop_back();
  }

  std::map<std::string, std::string> scrape(const std::vector<json>& pods,
                                            const planner::MetricNames& names) override {
    std::vector<std::string> wanted;
    for (const json& pod : pods) wanted.push_back(podName(pod));
    // The prefix after host:port (a Prometheus behind a path) goes before /federate.
    const size_t scheme = url_.find("://");
    const size_t path_start = url_.find('/', scheme == std::string::npos ? 0 : scheme + 3);
    const std::string base = path_start == std::string::npos ? url_ : url_.substr(0, path_start);
    const std::string prefix = path_start == std::string::npos ? "" : url_.substr(path_start);
    const std::string path = prefix + "/federate?match[]=" +
                             httplib::detail::encode_query_param(federationSelector(names));
    httplib::Client client(base);
    std::optional<std::string> text = httpGet(client, path);
    if (!text) {
      TANDEM_LOG(kWarn) << "controller: planner: no answer from " << url_
                        << "/federate; the round has no metrics";
      return {};
    }
    return splitByPod(*text, pod_label_, wanted);
  }
  std::string describe() const override { return "prometheus " + url_; }

 private:
  std::string url_;
  std::string pod_label_;
};

}  // namespace

std::unique_ptr<PodMetricsSource> podScrapeSource() { return std::make_unique<PodScrapeSource>(); }

std::unique_ptr<PodMetricsSource> prometheusFederationSource(std::string url,
                                                             std::string pod_label) {
  return std::make_unique<FederationSource>(std::move(url), std::move(pod_label));
}

std::optional<std::pair<std::string, int>> podMetricsAddress(const json& pod) {
  const json status = pod.value("status", json::object());
  const std::string ip = status.value("podIP", "");
  if (ip.empty()) return std::nullopt;
  std::optional<int> port;
  const json spec = pod.value("spec", json::object());
  for (const json& container : spec.value("containers", json::array())) {
    for (const json& item : container.value("ports", json::array())) {
      if (!item.contains("containerPort") || !item["containerPort"].is_number_integer()) continue;
      const int number = item["containerPort"].get<int>();
      if (item.value("name", "") == "http") return std::make_pair(ip, number);
      if (!port) port = number;
    }
  }
  if (!port) return std::nullopt;
  return std::make_pair(ip, *port);
}

std::string federationSelector(const planner::MetricNames& names) {
  std::vector<std::string> series;
  if (!names.latency_histogram.empty()) series.push_back(names.latency_histogram + "_bucket");
  for (const std::string* gauge : {&names.queued_prefill_tokens, &names.running_sequences,
                                   &names.waiting_sequences, &names.kv_cache_usage}) {
    if (!gauge->empty()) series.push_back(*gauge);
  }
  std::string alternatives;
  for (const std::string& name : series) {
    if (!alternatives.empty()) alternatives += "|";
    alternatives += name;
  }
  return "{__name__=~\"" + alternatives + "\"}";
}

std::map<std::string, std::string> splitByPod(std::string_view text, std::string_view pod_label,
                                              const std::vector<std::string>& pods) {
  std::map<std::string, std::string> texts;
  while (!text.empty()) {
    const size_t newline = text.find('\n');
    std::string_view line = text.substr(0, newline);
    text = newline == std::string_view::npos ? std::string_view() : text.substr(newline + 1);
    if (line.empty() || line.starts_with('#')) continue;
    const std::optional<PrometheusSampleLine> sample = parsePrometheusSampleLine(line);
    if (!sample) continue;
    const std::optional<std::string> pod = sample->label(pod_label);
    if (!pod || std::find(pods.begin(), pods.end(), *pod) == pods.end()) continue;
    std::string& out = texts[*pod];
    out.append(line);
    out.push_back('\n');
  }
  return texts;
}

}  // namespace tandem::controller
