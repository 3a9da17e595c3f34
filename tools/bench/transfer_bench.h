// `tandem-bench transfer`: KV hand-off bandwidth between two agent processes.
//
// For each UCX transport (UCX_TLS=sm, tcp, ...) starts a prefill agent
// (kv_producer) and a decode agent (kv_consumer) with the ucx connector and
// drives the prefill → decode hand-off the way the router does: a prompt of
// k·block_size + 1 tokens to the prefill agent with do_remote_decode and
// max_tokens 1, then the same prompt with the returned kv_transfer_params and
// do_remote_prefill to the decode agent, whose /metrics
// (tandem_kv_transfer_bytes_total, tandem_kv_transfer_duration_seconds) give
// the bytes and seconds of its read. N blocks move as hand-offs of at most
// what one prompt can hold (the model's context less two tokens); prompts are
// fresh each time so no prefix cache hits. Unmeasured hand-offs first write
// every block of both agents' pools once, so the figures are those of warm,
// steady-state pools. Next to it, in the same run and for the same bytes:
// ucx_perftest -t ucp_get of one message between two processes over the same
// transport, and a single-thread memcpy. Then the read's share of the time to
// first token for a few prompt lengths.
//
// Prints a table and optionally writes JSON. Asserts nothing about speed; a
// missing or failing ucx_perftest is reported as n/a with the reason. Throws
// tandem::Error for bad options and when an agent or a hand-off fails.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tandem::bench {

struct TransferBenchOptions {
  std::string model_dir;                      // empty: the `small` preset written to a temp dir
  std::vector<int64_t> blocks = {256, 1024};  // blocks moved per measurement
  std::vector<std::string> transports = {"sm", "tcp"};  // UCX_TLS values
  std::vector<int64_t> ttft_prompts = {512, 2048};      // prompt lengths for the TTFT share
  int repeats = 3;                                      // measurements per figure; median reported
  int block_size = 16;                                  // agent --block-size
  std::string kv_dtype = "bf16";                        // agent --kv-dtype
  std::string agent_bin;                      // empty: tandem-agent next to this executable
  std::string ucx_perftest = "ucx_perftest";  // path, or a name looked up in PATH
  std::string json_path;                      // empty: no JSON file
};

// Runs the benchmark; returns 0 when every hand-off moved what it should.
int runTransferBench(const TransferBenchOptions& options);

}  // namespace tandem::bench
