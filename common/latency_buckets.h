// The bucket bounds, in seconds, of the latency histograms that agents
// (tandem_*) and the router (tandem_router_*) both export, so that their
// quantiles compare like with like. vLLM's bounds for the same figures
// (vllm:time_to_first_token_seconds, vllm:e2e_request_latency_seconds),
// so dashboards port; inter-token latency adds bounds between 1 and 40 ms
// to vLLM's (which start at 10 ms and then step to 25 and 50: a GPU decode
// step takes 5 to 40 ms), keeping every bound of vLLM's.
#pragma once

#include <vector>

namespace tandem {

inline const std::vector<double> kTtftBucketBounds = {
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,   0.75,
    1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
inline const std::vector<double> kItlBucketBounds = {
    0.001, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1,  0.15, 0.2,
    0.3,   0.4,   0.5,  0.75,  1.0,  2.5,   5.0,  7.5,  10.0, 20.0,  40.0, 80.0};
inline const std::vector<double> kRequestBucketBounds = {
    0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
    30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};

}  // namespace tandem
