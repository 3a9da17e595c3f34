// tandem-bench: benchmark programs. They print figures and write JSON; they
// never pass or fail on speed.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>

#include "common/command_line/command_line.h"
#include "kernels/backend.h"
#include "tools/bench/calibrate_bench.h"
#include "tools/bench/chaos_bench.h"
#include "tools/bench/engine_bench.h"
#include "tools/bench/large_body_bench.h"
#include "tools/bench/multiturn_bench.h"
#include "tools/bench/planner_bench.h"
#include "tools/bench/router_bench.h"
#include "tools/bench/serve_bench.h"
#include "tools/bench/soak_bench.h"
#include "tools/bench/speculative_bench.h"
#include "tools/bench/structured_bench.h"
#include "tools/bench/transfer_bench.h"

int main(int argc, char** argv) {
  CLI::App app{"tandem-bench: Tandem benchmarks"};
  app.require_subcommand(1);

  auto* engine = app.add_subcommand("engine", "prefill/decode/GEMM throughput of one engine");
  tandem::bench::EngineBenchOptions options;
  engine->add_option("--model", options.model_dir, "Hugging Face model directory")->required();
  engine->add_option("--threads", options.threads, "kernel threads (0: every CPU it may use)")
      ->capture_default_str();
  engine->add_option("--prompt-tokens", options.prompt_tokens, "prefill prompt length")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  engine->add_option("--decode-tokens", options.decode_tokens, "tokens decoded")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  engine->add_option("--repeats", options.repeats, "runs per figure (best is reported)")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  engine->add_option("--kv-dtype", options.kv_dtype, "KV cache dtype: bf16, f32 or fp8")
      ->capture_default_str();
  engine
      ->add_option("--compute-dtype", options.compute_dtype,
                   "what the GEMMs multiply: f32 (exact products) or bf16 (bf16-rounded "
                   "activations)")
      ->capture_default_str();
  engine->add_option("--device", options.device, "compute backend: cpu, cuda or auto")
      ->capture_default_str();
  engine
      ->add_option(
          "--cuda-kernels", options.cuda_kernels,
          "CUDA kernels: auto (fast on CUDA), reference, fast or flash (docs/cuda.md#kernel-sets)")
      ->capture_default_str();
  engine->add_option("--batch", options.batch, "sequences decoding together")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  engine
      ->add_option("--copy-mib", options.copy_mib,
                   "buffer of the backend copy bandwidth reference, MiB")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  engine->add_option("--json", options.json_path, "also write the figures as JSON here");
  engine->add_option("--lora", options.lora_dir,
                     "a PEFT LoRA adapter: prefill and decode measured again with every sequence "
                     "running it, side by side");
  engine->add_flag("--fuse-projections", options.fuse_projections,
                   "Q/K/V and gate/up as one matmul each, and fewer launches on CUDA (the "
                   "same bits)");
  engine->add_flag("--bf16-gemm-configs", options.bf16_gemm_configs,
                   "also time layer 0's matmuls at --prompt-tokens rows with each bf16 GEMM "
                   "configuration, side by side (CUDA, bf16 compute; the same bits in each)");
  engine
      ->add_option("--bf16-gemm-config", options.bf16_gemm_config,
                   "the bf16 GEMM configuration of the whole run (CUDA, bf16 compute; 1 the "
                   "serving one, the others for measuring: docs/cuda.md)")
      ->check(CLI::Range(0, tandem::kernels::kBf16GemmConfigs - 1))
      ->capture_default_str();
  engine->add_flag("--unordered-decode", options.unordered_decode,
                   "NOT batch-invariant: bf16 decode matmuls split k and add with atomics, to "
                   "measure what the fixed order costs (CUDA, fast kernels, bf16 compute)");
  engine->add_flag("--deep-skinny", options.deep_skinny,
                   "bf16 decode matmuls stream their weights through shared memory, several "
                   "batches in flight per warp, and past 16 rows share x there per block (CUDA, "
                   "fast kernels, bf16 compute; the same bits)");
  engine->add_flag("--compact-attention", options.compact_attention,
                   "the flash attention kernel launched with one block per query tile of a "
                   "prefill, not one per row, each through a run of splits (CUDA, "
                   "--cuda-kernels flash; the same bits)");
  engine->add_flag("--deep-attention", options.deep_attention,
                   "a decode step's flash attention copies all of a 256-position split's K and V "
                   "into shared memory at once (three of its four tiles past a block per SM; "
                   "CUDA, --cuda-kernels flash; the same bits)");
  engine->add_flag("--profile-ops", options.profile_ops,
                   "also time each backend call of one prefill and one decode, alone "
                   "(eager, synchronized around every call), and print them per step");

  auto* router = app.add_subcommand(
      "router", "what the router adds: routed vs direct latency and its decision time");
  tandem::bench::RouterBenchOptions router_options;
  router->add_option("--agent-url", router_options.agent_url, "a running tandem-agent")
      ->capture_default_str();
  router->add_option("--requests", router_options.requests, "request pairs (direct, routed)")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  router->add_option("--prompt-tokens", router_options.prompt_tokens, "prompt length")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  router->add_option("--max-tokens", router_options.max_tokens, "tokens generated per request")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  router->add_option("--json", router_options.json_path, "also write the figures as JSON here");
  router
      ->add_option("--agents", router_options.scale.agents,
                   "cluster mode: start this many simulated agents (half prefill, half decode) "
                   "behind tandem-operator local instead of using --agent-url; 0: off")
      ->check(CLI::Range(0, 1024))
      ->capture_default_str();
  router
      ->add_option("--simulate", router_options.scale.simulate,
                   "cluster mode: the agents' step-time profile")
      ->capture_default_str();
  router->add_option("--policy", router_options.scale.policy, "cluster mode: the router's policy")
      ->check(CLI::IsMember({"kv", "round_robin", "random"}))
      ->capture_default_str();
  router
      ->add_option("--prompt", router_options.scale.prompt_kinds,
                   "cluster mode: prompts sent as token ids, text or both")
      ->check(CLI::IsMember({"ids", "text", "both"}))
      ->capture_default_str();
  router
      ->add_option("--shared-prefix", router_options.scale.shared_prefix,
                   "cluster mode: fraction of every prompt that all prompts share")
      ->check(CLI::Range(0.0, 0.99))
      ->capture_default_str();
  router->add_option("--model-dir", router_options.scale.model_dir,
                     "cluster mode: model directory (default: the tiny test model)");
  router
      ->add_option("--kv-cache-memory", router_options.scale.kv_cache_memory,
                   "cluster mode: each agent's simulated KV memory")
      ->capture_default_str();
  router->add_option("--work-dir", router_options.scale.work_dir,
                     "cluster mode: logs and cluster file (default: a temporary directory)");
  router->add_option("--operator-bin", router_options.scale.operator_bin,
                     "cluster mode: tandem-operator (default: next to tandem-bench)");

  auto* multiturn = app.add_subcommand(
      "multiturn", "multi-turn conversations against a running OpenAI-compatible server");
  tandem::bench::MultiTurnBenchOptions multiturn_options;
  multiturn
      ->add_option("--base-url", multiturn_options.base_url,
                   "server base URL (scheme://host:port): an agent or the router")
      ->capture_default_str();
  multiturn->add_option("--model", multiturn_options.model,
                        "model name (default: first of /v1/models)");
  multiturn
      ->add_option("--num-clients", multiturn_options.num_clients,
                   "concurrent clients, each one conversation at a time")
      ->capture_default_str();
  multiturn
      ->add_option("--num-conversations", multiturn_options.num_conversations,
                   "conversations in all")
      ->capture_default_str();
  multiturn->add_option("--turns", multiturn_options.turns, "turns (requests) per conversation")
      ->capture_default_str();
  multiturn
      ->add_option("--shared-prefix-tokens", multiturn_options.shared_prefix_tokens,
                   "tokens every conversation starts with (a system prompt)")
      ->capture_default_str();
  multiturn
      ->add_option("--prefix-groups", multiturn_options.prefix_groups,
                   "distinct shared prefixes, each of --shared-prefix-tokens")
      ->capture_default_str();
  multiturn
      ->add_option("--prefix-zipf", multiturn_options.prefix_zipf,
                   "each conversation's prefix group is drawn Zipf(S) (0: uniform)")
      ->capture_default_str();
  multiturn
      ->add_option("--input-tokens", multiturn_options.input_tokens,
                   "new user tokens per turn: constant:N, uniform:A,B or lognormal:MEAN,SIGMA")
      ->capture_default_str();
  multiturn
      ->add_option("--output-tokens", multiturn_options.output_tokens,
                   "answer tokens per turn: constant:N, uniform:A,B or lognormal:MEAN,SIGMA")
      ->capture_default_str();
  multiturn
      ->add_option("--request-rate", multiturn_options.request_rate,
                   "Poisson arrivals in requests/s over all clients (inf: as fast as they go)")
      ->capture_default_str();
  multiturn
      ->add_option("--arrival", multiturn_options.arrival,
                   "closed (clients, as above) or poisson:RATE: open loop, conversations arrive "
                   "Poisson so that RATE requests/s are offered")
      ->capture_default_str();
  multiturn->add_option("--seed", multiturn_options.seed, "seed for tokens, lengths and arrivals")
      ->capture_default_str();
  multiturn
      ->add_option("--vocab-range", multiturn_options.vocab_range,
                   "prompt token ids drawn from [LO, HI)")
      ->capture_default_str();
  multiturn->add_flag_function(
      "--progress,!--no-progress",
      [&](int64_t count) { multiturn_options.progress = count > 0 ? "on" : "off"; },
      "draw a progress bar on stderr, or not (default: when stderr is a terminal)");
  multiturn
      ->add_option("--read-timeout", multiturn_options.read_timeout_s,
                   "seconds a request may wait for its next bytes")
      ->capture_default_str();
  multiturn->add_option("--json", multiturn_options.json_path,
                        "also write the figures, per turn and per request, as JSON here");
  multiturn->add_option("--plot", multiturn_options.plot_path,
                        "also draw the TTFT CDF into this PNG (needs gnuplot on PATH)");
  multiturn->add_option("--slo-ttft-ms", multiturn_options.slo_ttft_ms,
                        "goodput: a good request's TTFT is at most this many ms");
  multiturn->add_option("--slo-itl-ms", multiturn_options.slo_itl_ms,
                        "goodput: a good request's mean ITL is at most this many ms");
  multiturn
      ->add_option("--agent-metrics", multiturn_options.agent_metrics,
                   "agents' base URLs (comma-separated) whose counters give prompt tokens computed")
      ->delimiter(',');
  multiturn->add_option("--cluster-file", multiturn_options.cluster_file,
                        "start tandem-operator local -f FILE per policy instead of --base-url");
  multiturn
      ->add_option("--policies", multiturn_options.policies,
                   "with --cluster-file: routing policies to compare, comma-separated")
      ->delimiter(',')
      ->capture_default_str();
  multiturn
      ->add_option("--rounds", multiturn_options.rounds,
                   "with --cluster-file: interleaved rounds of every policy, order rotated")
      ->capture_default_str();
  multiturn->add_option("--work-dir", multiturn_options.work_dir,
                        "with --cluster-file: where the clusters' logs go (default: a temp dir)");
  multiturn->add_option("--operator-bin", multiturn_options.operator_bin,
                        "with --cluster-file: tandem-operator (default: next to tandem-bench)");

  auto* serve = app.add_subcommand(
      "serve", "latency and throughput of a running OpenAI-compatible server under load");
  tandem::bench::ServeBenchOptions serve_options;
  serve->add_option("--url", serve_options.url, "server base URL (scheme://host:port)")
      ->capture_default_str();
  serve->add_option("--model", serve_options.model, "model name (default: first of /v1/models)");
  serve->add_option("--num-prompts", serve_options.num_prompts, "requests to send")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  serve
      ->add_option("--request-rate", serve_options.request_rate,
                   "Poisson arrival rate in requests/s (inf: all at once)")
      ->capture_default_str();
  serve
      ->add_option("--max-concurrency", serve_options.max_concurrency,
                   "requests in flight at most (0: no cap)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  serve->add_option("--input-len", serve_options.input_len, "prompt tokens per request")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  serve
      ->add_option("--input-len-range", serve_options.input_len_range,
                   "input lengths uniform in [len*(1-F), len*(1+F)]")
      ->capture_default_str();
  serve->add_option("--output-len", serve_options.output_len, "output tokens per request")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  serve
      ->add_option("--output-len-range", serve_options.output_len_range,
                   "output lengths uniform in [len*(1-F), len*(1+F)]")
      ->capture_default_str();
  serve->add_option("--seed", serve_options.seed, "seed for prompts, lengths and arrivals")
      ->capture_default_str();
  serve
      ->add_option("--vocab-range", serve_options.vocab_range,
                   "prompt token ids drawn from [LO, HI)")
      ->capture_default_str();
  serve->add_option("--goodput", serve_options.goodput,
                    "SLOs for goodput, any of ttft:MS tpot:MS e2el:MS");
  serve->add_option("--priority", serve_options.priority,
                    "send every request with this priority (the server must schedule by "
                    "priority unless it is 0)");
  serve
      ->add_option("--read-timeout", serve_options.read_timeout_s,
                   "seconds a request may wait for its next bytes")
      ->capture_default_str();
  serve->add_option("--json", serve_options.json_path,
                    "also write the figures and per-request records as JSON here");

  auto* transfer = app.add_subcommand(
      "transfer", "KV hand-off bandwidth between two agents over UCX, with references");
  tandem::bench::TransferBenchOptions transfer_options;
  transfer->add_option("--model", transfer_options.model_dir,
                       "Hugging Face model directory (default: the small preset, generated)");
  transfer->add_option("--blocks", transfer_options.blocks, "blocks moved per measurement")
      ->delimiter(',')
      ->capture_default_str();
  transfer->add_option("--transports", transfer_options.transports, "UCX_TLS values to measure")
      ->delimiter(',')
      ->capture_default_str();
  transfer
      ->add_option("--ttft-prompts", transfer_options.ttft_prompts,
                   "prompt lengths for the hand-off's share of TTFT")
      ->delimiter(',')
      ->capture_default_str();
  transfer->add_option("--repeats", transfer_options.repeats, "runs per figure (median reported)")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  transfer->add_option("--block-size", transfer_options.block_size, "agents' KV block size")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  transfer
      ->add_option("--kv-dtype", transfer_options.kv_dtype, "agents' KV dtype: bf16, f32 or fp8")
      ->capture_default_str();
  transfer->add_option("--agent-bin", transfer_options.agent_bin,
                       "tandem-agent executable (default: next to tandem-bench)");
  transfer
      ->add_option("--ucx-perftest", transfer_options.ucx_perftest,
                   "ucx_perftest executable, a path or a name in PATH")
      ->capture_default_str();
  transfer->add_option("--json", transfer_options.json_path, "also write the figures as JSON here");

  // chaos and soak: a local cluster through tandem-operator, and multi-turn load.
  auto addClusterOptions = [](CLI::App* command, tandem::bench::LocalClusterOptions& cluster,
                              tandem::bench::LoadOptions& load) {
    command->add_option("--cluster", cluster.cluster_file,
                        "cluster file for tandem-operator local (default: one is written)");
    command->add_option("--operator-bin", cluster.operator_bin,
                        "tandem-operator executable (default: next to tandem-bench)");
    command->add_option("--agent-bin", cluster.agent_bin,
                        "tandem-agent for the reference (default: next to tandem-bench)");
    command->add_option("--model", cluster.model_dir,
                        "model directory of the written cluster (default: tiny, generated)");
    command->add_option("--prefill", cluster.prefill_replicas, "prefill agents (written cluster)")
        ->check(CLI::Range(0, 64))
        ->capture_default_str();
    command->add_option("--decode", cluster.decode_replicas, "decode agents (written cluster)")
        ->check(CLI::Range(1, 64))
        ->capture_default_str();
    command->add_option("--num-blocks", cluster.num_blocks, "KV blocks per agent (written cluster)")
        ->check(CLI::Range(1, 1 << 24))
        ->capture_default_str();
    command
        ->add_option("--agent-threads", cluster.agent_threads,
                     "kernel threads per agent (written cluster)")
        ->check(CLI::Range(0, 1024))
        ->capture_default_str();
    command
        ->add_option("--max-inflight", cluster.max_inflight_requests,
                     "router maxInflightRequests (written cluster)")
        ->check(CLI::Range(1, 1 << 20))
        ->capture_default_str();
    command
        ->add_option("--max-queued", cluster.max_queued_requests,
                     "router maxQueuedRequests (written cluster)")
        ->check(CLI::Range(0, 1 << 20))
        ->capture_default_str();
    command
        ->add_option("--abort-timeout", cluster.abort_timeout_s,
                     "seconds agents hold unread KV blocks (written cluster); above 15: a "
                     "reader takes a hold only with read_timeout_s (10) + 5 s left")
        ->check(CLI::Range(16.0, 3600.0))
        ->capture_default_str();
    command->add_option("--load-clients", load.clients, "multi-turn clients")
        ->check(CLI::Range(1, 4096))
        ->capture_default_str();
    command->add_option("--turns", load.turns, "turns per conversation")
        ->check(CLI::Range(1, 1000))
        ->capture_default_str();
    command
        ->add_option("--shared-prefix-tokens", load.shared_prefix_tokens,
                     "tokens every conversation starts with")
        ->check(CLI::Range(0, 1 << 20))
        ->capture_default_str();
    command->add_option("--input-tokens", load.input_tokens, "new user tokens per turn")
        ->capture_default_str();
    command->add_option("--output-tokens", load.output_tokens, "answer tokens per turn")
        ->capture_default_str();
    command->add_option("--vocab-range", load.vocab_range, "prompt token ids drawn from [LO, HI)")
        ->capture_default_str();
    command->add_option("--seed", load.seed, "seed of the load and of the faults")
        ->capture_default_str();
    command
        ->add_option("--hang-timeout", load.hang_timeout_s,
                     "seconds without a byte after which a request counts as hung")
        ->capture_default_str();
  };

  auto* chaos = app.add_subcommand(
      "chaos",
      "kills, stops, drains, client aborts and overload under multi-turn load, local cluster");
  tandem::bench::ChaosBenchOptions chaos_options;
  addClusterOptions(chaos, chaos_options.cluster, chaos_options.load);
  chaos->add_option("--scenarios", chaos_options.scenarios, "any of kill,move,abort,overload")
      ->capture_default_str();
  chaos->add_option("--kills", chaos_options.kills, "agents killed (SIGKILL)")
      ->capture_default_str();
  chaos->add_option("--stops", chaos_options.stops, "agents stopped (SIGSTOP, then SIGCONT)")
      ->capture_default_str();
  chaos
      ->add_option("--drains", chaos_options.drains,
                   "decode agents drained (POST /admin/drain: their streams are handed over)")
      ->capture_default_str();
  chaos
      ->add_option("--moves", chaos_options.move.rounds,
                   "move scenario: rounds, a decode agent drained then killed alternately")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  chaos
      ->add_option("--move-actions", chaos_options.move.actions,
                   "move scenario: what each round does, in turn: drain (POST /admin/drain), "
                   "kill (SIGKILL), rollout (an edit of the DecodePool that local mode rolls)")
      ->delimiter(',')
      ->capture_default_str()
      ->check(CLI::IsMember({"drain", "kill", "rollout"}));
  chaos->add_option("--move-streams", chaos_options.move.streams, "move scenario: streams a round")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  chaos
      ->add_option("--move-prompt-tokens", chaos_options.move.prompt_tokens,
                   "move scenario: prompt tokens of each stream (within the model's length)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  chaos
      ->add_option("--move-output-tokens", chaos_options.move.output_tokens,
                   "move scenario: tokens each stream generates")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  chaos
      ->add_option("--event-gap", chaos_options.event_gap_s,
                   "longest random pause in seconds before each kill or stop")
      ->capture_default_str();
  chaos
      ->add_option("--stop-max", chaos_options.stop_max_s,
                   "longest random time in seconds an agent stays stopped")
      ->capture_default_str();
  chaos->add_option("--aborts", chaos_options.aborts, "clients that leave at a random moment")
      ->capture_default_str();
  chaos->add_option("--abort-clients", chaos_options.abort_clients, "aborting clients at once")
      ->capture_default_str();
  chaos
      ->add_option("--overload-factor", chaos_options.overload_factor,
                   "overload clients as a multiple of max_inflight + max_queued")
      ->capture_default_str();
  chaos
      ->add_option("--overload-clients", chaos_options.overload_clients,
                   "overload clients (0: from --overload-factor)")
      ->capture_default_str();
  chaos
      ->add_option("--settle-timeout", chaos_options.settle_timeout_s,
                   "seconds to wait for blocks, gauges and descriptors to come back")
      ->capture_default_str();
  chaos
      ->add_option("--exactness-checks", chaos_options.exactness_checks,
                   "ok answers compared with the reference agent (0: all)")
      ->capture_default_str();
  chaos->add_option("--work-dir", chaos_options.work_dir, "logs and generated files");
  chaos->add_option("--json", chaos_options.json_path, "also write the figures as JSON here");

  auto* soak = app.add_subcommand(
      "soak", "steady multi-turn load on a local cluster: RSS slopes, failures, leaked blocks");
  tandem::bench::SoakBenchOptions soak_options;
  addClusterOptions(soak, soak_options.cluster, soak_options.load);
  soak->add_option("--duration", soak_options.duration_s, "seconds of load")->capture_default_str();
  soak->add_option("--sample-interval", soak_options.sample_interval_s,
                   "seconds between RSS samples")
      ->capture_default_str();
  soak->add_option("--settle-timeout", soak_options.settle_timeout_s,
                   "seconds to wait for blocks to come back")
      ->capture_default_str();
  soak->add_option("--exactness-checks", soak_options.exactness_checks,
                   "ok answers compared with the reference agent (0: all)")
      ->capture_default_str();
  soak->add_option("--work-dir", soak_options.work_dir, "logs and generated files");
  soak->add_option("--json", soak_options.json_path, "also write the figures as JSON here");

  auto* calibrate = app.add_subcommand(
      "calibrate", "fit a step-time profile (simulated agents) to timed forward passes");
  tandem::bench::CalibrateBenchOptions calibrate_options;
  calibrate->add_option("--model", calibrate_options.model_dir, "Hugging Face model directory")
      ->required();
  calibrate->add_option("--device", calibrate_options.device, "compute backend: cpu, cuda or auto")
      ->capture_default_str();
  calibrate->add_option("--out", calibrate_options.out_path,
                        "write the profile YAML here (default: printed only)");
  calibrate->add_option("--name", calibrate_options.name,
                        "profile name (default: <device>-<model directory name>)");
  calibrate->add_option("--samples", calibrate_options.samples, "timed runs per shape (median)")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  calibrate
      ->add_option("--threads", calibrate_options.threads,
                   "kernel threads (0: every CPU it may use)")
      ->check(CLI::Range(0, 1024))
      ->capture_default_str();
  calibrate
      ->add_option("--kv-dtype", calibrate_options.kv_dtype, "KV cache dtype: bf16, f32 or fp8")
      ->capture_default_str();
  calibrate->add_option("--block-size", calibrate_options.block_size, "KV block size")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  calibrate
      ->add_option("--context", calibrate_options.context,
                   "positions the shapes span (0: the model's context, at most 4096)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 24))
      ->capture_default_str();
  calibrate->add_option("--json", calibrate_options.json_path,
                        "also write the per-shape figures and the fit as JSON here");

  auto* planner = app.add_subcommand(
      "planner", "the SLA planner on a load ramp: replicas, TTFT/ITL p90 and goodput per phase");
  tandem::bench::PlannerBenchOptions planner_options;
  planner->add_option("--cluster-file", planner_options.cluster_file,
                      "cluster file to run (default: a generated one of simulated agents)");
  planner->add_option("--operator-bin", planner_options.operator_bin,
                      "tandem-operator (default: next to tandem-bench)");
  planner
      ->add_option("--phases", planner_options.phases,
                   "DURATION:RATE:SHAPE,... (seconds, requests/s, prefill or decode)")
      ->capture_default_str();
  planner
      ->add_option("--planner-interval", planner_options.planner_interval_s,
                   "seconds between planner rounds")
      ->capture_default_str();
  planner->add_option("--model-dir", planner_options.model_dir, "generated cluster: model")
      ->capture_default_str();
  planner->add_option("--profile", planner_options.profile, "generated cluster: step profile")
      ->capture_default_str();
  planner->add_option("--min-replicas", planner_options.min_replicas, "generated cluster")
      ->capture_default_str();
  planner->add_option("--max-replicas", planner_options.max_replicas, "generated cluster")
      ->capture_default_str();
  planner
      ->add_option("--target-ttft", planner_options.target_ttft_s,
                   "generated cluster: prefill targetTTFTSeconds")
      ->capture_default_str();
  planner
      ->add_option("--target-itl", planner_options.target_itl_s,
                   "generated cluster: decode targetITLSeconds")
      ->capture_default_str();
  planner->add_option("--window", planner_options.window_s, "generated cluster: windowSeconds")
      ->capture_default_str();
  planner
      ->add_option("--scale-down-stabilization", planner_options.scale_down_stabilization_s,
                   "generated cluster: scaleDownStabilizationSeconds")
      ->capture_default_str();
  planner->add_option("--max-step", planner_options.max_step, "generated cluster: maxStep")
      ->capture_default_str();
  planner->add_option("--prefill-prompt-tokens", planner_options.prefill_prompt_tokens)
      ->capture_default_str();
  planner->add_option("--prefill-output-tokens", planner_options.prefill_output_tokens)
      ->capture_default_str();
  planner->add_option("--decode-prompt-tokens", planner_options.decode_prompt_tokens)
      ->capture_default_str();
  planner->add_option("--decode-output-tokens", planner_options.decode_output_tokens)
      ->capture_default_str();
  planner->add_option("--vocab-range", planner_options.vocab_range, "prompt token ids LO:HI")
      ->capture_default_str();
  planner->add_option("--seed", planner_options.seed, "arrivals and prompts")
      ->capture_default_str();
  planner
      ->add_option("--max-concurrency", planner_options.max_concurrency,
                   "requests in flight at most")
      ->capture_default_str();
  planner
      ->add_option("--read-timeout", planner_options.read_timeout_s,
                   "longest wait for the next bytes of a response")
      ->capture_default_str();
  planner->add_option("--work-dir", planner_options.work_dir, "logs and generated files");
  planner->add_option("--json", planner_options.json_path, "also write the figures as JSON here");
  planner->add_option("--plot", planner_options.plot_path,
                      "draw replicas and TTFT/ITL p90 over time into this PNG (needs gnuplot)");

  auto* large = app.add_subcommand(
      "large-bodies", "memory and time a running server spends on very large request bodies");
  tandem::bench::LargeBodyBenchOptions large_options;
  large->add_option("--url", large_options.url, "the server (an agent or the router)")
      ->capture_default_str();
  large->add_option("--pid", large_options.pid, "the server's process id, to read its memory")
      ->required();
  large
      ->add_option("--concurrency", large_options.concurrency,
                   "clients sending at once, one level after another")
      ->delimiter(',')
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  large->add_option("--mb", large_options.mb, "prompt size, MB")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  large->add_option("--endpoint", large_options.endpoint, "where to send the bodies")
      ->check(CLI::IsMember({"/v1/completions", "/v1/chat/completions", "/tokenize"}))
      ->capture_default_str();
  large
      ->add_option("--settle", large_options.settle_s,
                   "seconds to wait before reading the memory left after a level")
      ->check(CLI::Range(0.0, 600.0))
      ->capture_default_str();
  large
      ->add_option("--truncate", large_options.truncate,
                   "send truncate_prompt_tokens (-1 or at least 1; 0: none): the prompt is "
                   "tokenized and its last tokens served instead of refused")
      ->check(CLI::Range(int64_t{-1}, int64_t{1} << 40))
      ->capture_default_str();
  large->add_option("--json", large_options.json_path, "also write the figures as JSON here");

  auto* structured = app.add_subcommand(
      "structured", "structured outputs: mask and advance time per token, compile time");
  tandem::bench::StructuredBenchOptions structured_options;
  structured
      ->add_option("--tokenizer", structured_options.tokenizers,
                   "a tokenizer directory or tokenizer.json (repeat for several)")
      ->required();
  structured->add_option("--walks", structured_options.walks, "random outputs per schema")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  structured->add_option("--max-steps", structured_options.max_steps, "tokens per output at most")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  structured->add_option("--seed", structured_options.seed, "random walks' seed")
      ->capture_default_str();
  structured->add_option("--model", structured_options.model_dir,
                         "also measure decode tok/s constrained vs not on this model");
  structured->add_option("--batch", structured_options.batch, "requests decoding at once")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  structured->add_option("--decode-tokens", structured_options.decode_tokens, "tokens per request")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  structured->add_option("--rounds", structured_options.rounds, "alternating rounds")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  structured->add_option("--json", structured_options.json_path,
                         "also write the figures as JSON here");

  auto* speculative = app.add_subcommand(
      "speculative", "speculative decoding by prompt lookup: decode with drafts vs without");
  tandem::bench::SpeculativeBenchOptions speculative_options;
  speculative->add_option("--model", speculative_options.model_dir, "Hugging Face model directory")
      ->required();
  speculative
      ->add_option("--threads", speculative_options.threads,
                   "kernel threads (0: every CPU it may use)")
      ->capture_default_str();
  speculative
      ->add_option("--speculative-config", speculative_options.speculative_config,
                   "the speculating engine's --speculative-config")
      ->capture_default_str();
  speculative
      ->add_option("--prompts", speculative_options.prompts,
                   "repeat (a 32-token part repeated) or random tokens")
      ->check(CLI::IsMember({"repeat", "random"}))
      ->capture_default_str();
  speculative->add_option("--prompt-tokens", speculative_options.prompt_tokens, "prompt length")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  speculative->add_option("--max-tokens", speculative_options.max_tokens, "tokens per request")
      ->check(CLI::Range(2, 1 << 20))
      ->capture_default_str();
  speculative->add_option("--batch", speculative_options.batch, "requests decoding at once")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  speculative->add_option("--pairs", speculative_options.pairs, "alternating pairs of runs")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  speculative->add_option("--json", speculative_options.json_path,
                          "also write the figures as JSON here");

  if (const std::optional<int> exit = tandem::parseCommandLine(app, argc, argv, "tandem-bench")) {
    return *exit;
  }
  try {
    if (engine->parsed()) return tandem::bench::runEngineBench(options);
    if (multiturn->parsed()) return tandem::bench::runMultiTurnBench(multiturn_options);
    if (router->parsed()) return tandem::bench::runRouterBench(router_options);
    if (serve->parsed()) return tandem::bench::runServeBench(serve_options);
    if (transfer->parsed()) return tandem::bench::runTransferBench(transfer_options);
    if (chaos->parsed()) return tandem::bench::runChaosBench(chaos_options);
    if (soak->parsed()) return tandem::bench::runSoakBench(soak_options);
    if (calibrate->parsed()) return tandem::bench::runCalibrateBench(calibrate_options);
    if (planner->parsed()) return tandem::bench::runPlannerBench(planner_options);
    if (large->parsed()) return tandem::bench::runLargeBodyBench(large_options);
    if (structured->parsed()) return tandem::bench::runStructuredBench(structured_options);
    if (speculative->parsed()) return tandem::bench::runSpeculativeBench(speculative_options);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tandem-bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
