// `tandem-bench large-bodies`: what requests with very large bodies cost a
// running server (an agent or the router). For each concurrency level, that
// many clients at once send a completion whose prompt is --mb MB of text (far
// past any max_model_len; with --truncate, cut to its last tokens); the program samples the server
// process's resident memory (/proc/PID/status) while they run and after, and prints the peak over
// the level's start, the memory left afterwards, each answer's status and the time to it. Figures
// only, never a verdict: run it against two builds in one session to compare them
// (docs/benchmarks.md).
#pragma once

#include <string>
#include <vector>

namespace tandem::bench {

struct LargeBodyBenchOptions {
  std::string url = "http://127.0.0.1:8000";
  int pid = 0;  // the server process to watch
  std::vector<int> concurrency = {1, 4};
  int mb = 60;                               // prompt size, MB (10^6 bytes)
  double settle_s = 2.0;                     // wait before reading the memory left after a level
  std::string endpoint = "/v1/completions";  // or /v1/chat/completions, /tokenize
  // truncate_prompt_tokens sent with a completion (0: none): the server
  // tokenizes the whole prompt and serves its last ids instead of refusing.
  int64_t truncate = 0;
  std::string json_path;  // empty: no JSON file
};

int runLargeBodyBench(const LargeBodyBenchOptions& options);

}  // namespace tandem::bench
