#include "operator/k8s/leader_election.h"

#include <condition_variable>
#include <ctime>
#include <exception>
#include <random>

#include "common/logging.h"

namespace tandem::k8s {
namespace {

// As client-go: candidates wait retry_period * (1 + up to 1.2) between tries,
// so that many of them do not hit the API server in step.
constexpr double kJitterFactor = 1.2;

std::chrono::milliseconds jittered(std::chrono::milliseconds period) {
  thread_local std::mt19937_64 generator{std::random_device{}()};
  std::uniform_real_distribution<double> extra(0.0, kJitterFactor);
  return period + std::chrono::milliseconds(
                      static_cast<int64_t>(static_cast<double>(period.count()) * extra(generator)));
}

// The Lease's MicroTime: "2026-01-02T03:04:05.000000Z", from the wall clock.
std::string microTimeNow() {
  auto now = std::chrono::system_clock::now();
  auto micros =
      std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count();
  std::time_t seconds = static_cast<std::time_t>(micros / 1000000);
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char date[32];
  std::strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%S", &utc);
  char text[48];
  std::snprintf(text, sizeof(text), "%s.%06lldZ", date, static_cast<long long>(micros % 1000000));
  return text;
}

std::string holderOf(const nlohmann::json& spec) {
  auto it = spec.find("holderIdentity");
  return it != spec.end() && it->is_string() ? it->get<std::string>() : std::string();
}

std::string resourceVersionOf(const nlohmann::json& object) {
  auto metadata = object.find("metadata");
  if (metadata == object.end() || !metadata->is_object()) return "";
  auto version = metadata->find("resourceVersion");
  return version != metadata->end() && version->is_string() ? version->get<std::string>() : "";
}

const nlohmann::json& specOf(const nlohmann::json& lease) {
  static const nlohmann::json kEmpty = nlohmann::json::object();
  auto it = lease.find("spec");
  return it != lease.end() && it->is_object() ? *it : kEmpty;
}

int64_t leaseSeconds(std::chrono::milliseconds duration) {
  int64_t seconds = (duration.count() + 999) / 1000;
  return seconds < 1 ? 1 : seconds;
}

void invoke(const std::function<void()>& callback, const char* what) {
  if (!callback) return;
  try {
    callback();
  } catch (const std::exception& e) {
    TANDEM_LOG(kError) << "leader election: " << what << " threw: " << e.what();
  }
}

}  // namespace

// The election thread: one step, then a sleep (interrupted by stop()).
class LeaderElector::Loop {
 public:
  explicit Loop(LeaderElector& elector) : elector_(elector) {}

  void start() {
    thread_ = std::thread([this] { run(); });
  }

  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void run() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stopping_) {
      lock.unlock();
      elector_.tryAcquireOrRenew();
      // The leader renews every retry_period; candidates retry with jitter.
      std::chrono::milliseconds wait = elector_.isLeader()
                                           ? elector_.config_.retry_period
                                           : jittered(elector_.config_.retry_period);
      lock.lock();
      cv_.wait_for(lock, wait, [this] { return stopping_; });
    }
  }

  LeaderElector& elector_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread thread_;
};

LeaderElector::LeaderElector(ApiClient& client, LeaderElectionConfig config,
                             std::function<void()> on_started_leading,
                             std::function<void()> on_stopped_leading)
    : client_(client),
      config_(std::move(config)),
      on_started_leading_(std::move(on_started_leading)),
      on_stopped_leading_(std::move(on_stopped_leading)) {
  if (config_.ns.empty()) config_.ns = client_.config().default_namespace;
}

LeaderElector::~LeaderElector() { stop(); }

void LeaderElector::start() {
  if (loop_ != nullptr) return;
  loop_ = std::make_unique<Loop>(*this);
  loop_->start();
}

void LeaderElector::stop() {
  if (loop_ != nullptr) loop_->stop();
  std::lock_guard<std::mutex> lock(step_mutex_);
  if (!leader_.load()) return;
  // Stopped leading (its callback may wait for its writes) before the
  // Lease is released: nothing of this replica's lands after another leads.
  stopLeadingLocked();
  releaseLocked();
}

bool LeaderElector::tryAcquireOrRenew() {
  std::lock_guard<std::mutex> lock(step_mutex_);
  TimePoint now = config_.now();
  Result<nlohmann::json> got = client_.get(resources::kLeases, config_.ns, config_.name);
  if (!got.isOk()) {
    if (got.error().isNotFound()) {
      nlohmann::json lease = {
          {"apiVersion", resources::kLeases.apiVersion()},
          {"kind", resources::kLeases.kind},
          {"metadata", {{"name", config_.name}, {"namespace", config_.ns}}},
          {"spec", {{"leaseTransitions", 0}}},
      };
      return writeLeaseLocked(std::move(lease), /*create=*/true, now);
    }
    TANDEM_LOG(kWarn) << "leader election: reading Lease " << config_.ns << "/" << config_.name
                      << " failed: " << got.error().toString();
    stopLeadingPastDeadlineLocked();
    return false;
  }

  nlohmann::json lease = std::move(got).value();
  const nlohmann::json& spec = specOf(lease);
  std::string version = resourceVersionOf(lease);
  // Expiry is judged from when we saw the record change, on our own clock.
  if (version != observed_version_ || spec != observed_spec_) {
    observed_version_ = version;
    observed_spec_ = spec;
    observed_time_ = now;
  }
  std::string holder = holderOf(spec);
  if (!holder.empty() && holder != config_.identity) {
    if (leader_.load()) {
      TANDEM_LOG(kWarn) << "leader election: Lease " << config_.ns << "/" << config_.name
                        << " is now held by " << holder << "; stopping leading";
      stopLeadingLocked();
    }
    // The holder's own leaseDurationSeconds, as client-go reads it; ours
    // when the record has none.
    std::chrono::milliseconds duration = config_.lease_duration;
    if (auto seconds = spec.find("leaseDurationSeconds");
        seconds != spec.end() && seconds->is_number_integer() && seconds->get<int64_t>() > 0) {
      duration = std::chrono::seconds(seconds->get<int64_t>());
    }
    if (now < observed_time_ + duration) return false;
  }
  return writeLeaseLocked(std::move(lease), /*create=*/false, now);
}

bool LeaderElector::writeLeaseLocked(nlohmann::json lease, bool create, TimePoint now) {
  if (!lease["spec"].is_object()) lease["spec"] = nlohmann::json::object();
  nlohmann::json& spec = lease["spec"];
  std::string wall_time = microTimeNow();
  if (holderOf(spec) != config_.identity) {
    spec["acquireTime"] = wall_time;
    if (!create) {
      auto transitions = spec.find("leaseTransitions");
      int64_t previous = transitions != spec.end() && transitions->is_number_integer()
                             ? transitions->get<int64_t>()
                             : 0;
      spec["leaseTransitions"] = previous + 1;
    }
  }
  spec["holderIdentity"] = config_.identity;
  spec["leaseDurationSeconds"] = leaseSeconds(config_.lease_duration);
  spec["renewTime"] = wall_time;

  Result<nlohmann::json> written = create ? client_.create(resources::kLeases, config_.ns, lease)
                                          : client_.update(resources::kLeases, config_.ns, lease);
  if (!written.isOk()) {
    // A conflict means another candidate wrote first: not an error worth more than a try.
    if (!written.error().isConflict() && !written.error().isAlreadyExists()) {
      TANDEM_LOG(kWarn) << "leader election: writing Lease " << config_.ns << "/" << config_.name
                        << " failed: " << written.error().toString();
    }
    stopLeadingPastDeadlineLocked();
    return false;
  }
  observed_version_ = resourceVersionOf(*written);
  observed_spec_ = specOf(*written);
  observed_time_ = now;
  last_renew_ = now;
  if (!leader_.load()) startLeadingLocked(now);
  return true;
}

void LeaderElector::stopLeadingPastDeadlineLocked() {
  // The clock after the failed calls (a read and a write may take seconds
  // each): leading ends within renew_deadline of the last renewal, before
  // another candidate may take the Lease.
  if (leader_.load() && config_.now() - last_renew_ >= config_.renew_deadline) {
    stopLeadingLocked();
  }
}

void LeaderElector::startLeadingLocked(TimePoint now) {
  last_renew_ = now;
  leader_ = true;
  TANDEM_LOG(kInfo) << "leader election: " << config_.identity << " leads via Lease " << config_.ns
                    << "/" << config_.name;
  invoke(on_started_leading_, "on_started_leading");
}

void LeaderElector::stopLeadingLocked() {
  leader_ = false;
  TANDEM_LOG(kInfo) << "leader election: " << config_.identity << " stopped leading";
  invoke(on_stopped_leading_, "on_stopped_leading");
}

void LeaderElector::releaseLocked() {
  Result<nlohmann::json> got = client_.get(resources::kLeases, config_.ns, config_.name);
  if (!got.isOk()) {
    TANDEM_LOG(kWarn) << "leader election: release: reading Lease " << config_.ns << "/"
                      << config_.name << " failed: " << got.error().toString();
    return;
  }
  nlohmann::json lease = std::move(got).value();
  if (holderOf(specOf(lease)) != config_.identity) return;
  // As client-go's ReleaseOnCancel: an unheld record that expires in a second.
  std::string wall_time = microTimeNow();
  nlohmann::json& spec = lease["spec"];
  spec["holderIdentity"] = "";
  spec["leaseDurationSeconds"] = 1;
  spec["acquireTime"] = wall_time;
  spec["renewTime"] = wall_time;
  Result<nlohmann::json> written = client_.update(resources::kLeases, config_.ns, lease);
  if (!written.isOk()) {
    TANDEM_LOG(kWarn) << "leader election: releasing Lease " << config_.ns << "/" << config_.name
                      << " failed: " << written.error().toString();
  }
}

}  // namespace tandem::k8s
