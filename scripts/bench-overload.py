#!/usr/bin/env python3
"""A flood of mixed requests through the router, more than its agents hold
(docs/benchmarks.md#overload-through-the-router): what is served, what is
refused, and where.

    scripts/bench-overload.py [--model DIR] [--clients N] [--rounds N] [--json FILE] BUILD_DIR...

Each measurement starts a fresh stack from BUILD_DIR/bin: one prefill agent
(--max-waiting-requests 4) and two decode agents (--max-num-seqs 2
--max-waiting-requests 2), one kernel thread each, over UCX, behind a router
(--max-inflight-requests 16 --max-queued-requests 8, its kv policy), waits
for the router's first polls, then sends N requests at once (a quarter each
completions, chat, streamed completions and completions with n 2; 40 tokens
each, greedy). Printed per measurement: the clients' statuses, the decode
agents' own refusals (tandem_requests_total{finish_reason="rejected"}: each
after a prefill computed its prompt), the prefill agent's computed tokens
and the slowest client's seconds; then each build's medians. Several builds
are measured in turns, round by round, on the same machine: compare them
only within one run.
"""
import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(port, path):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as res:
            return res.status, res.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError:
        return 0, ""


def metric(port, name, labels=""):
    """Sum of the samples of `name` whose labels contain `labels`."""
    total = 0.0
    for line in get(port, "/metrics")[1].splitlines():
        if line.startswith(name) and line[len(name)] in "{ " and labels in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def post(port, path, body):
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=300) as res:
            res.read()
            return res.status
    except urllib.error.HTTPError as e:
        e.read()
        return e.code
    except OSError:
        return -1


def body_of(i, model_name):
    words = ["alpha", "beta", "gamma", "delta", "sigma", "omega"]
    text = " ".join(words[(i * 7 + k * 3) % len(words)] for k in range(30 + i % 20))
    body = {"model": model_name, "max_tokens": 40, "temperature": 0, "ignore_eos": True}
    kind = i % 4
    if kind == 1:
        body["messages"] = [{"role": "user", "content": text}]
        return "/v1/chat/completions", body
    body["prompt"] = text
    if kind == 2:
        body["stream"] = True
    if kind == 3:
        body["n"] = 2
    return "/v1/completions", body


def measure(build, model, clients, logs):
    bindir = os.path.join(build, "bin")
    ports = {name: free_port() for name in ("prefill", "decode-0", "decode-1", "router")}
    procs = []

    def start(name, args):
        log = open(os.path.join(logs, f"{name}.log"), "w")
        procs.append(subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT))

    def kv(role):
        return json.dumps({"kv_connector": "ucx", "kv_role": role})

    agent = [os.path.join(bindir, "tandem-agent"), "serve", "--model", model, "--threads", "1"]
    start("prefill", agent + ["--port", str(ports["prefill"]), "--role", "prefill",
                              "--max-waiting-requests", "4", "--kv-transfer-config",
                              kv("kv_producer")])
    for name in ("decode-0", "decode-1"):
        start(name, agent + ["--port", str(ports[name]), "--role", "decode", "--max-num-seqs", "2",
                             "--max-waiting-requests", "2", "--kv-transfer-config",
                             kv("kv_consumer")])
    start("router", [os.path.join(bindir, "tandem-operator"), "router", "--port",
                     str(ports["router"]), "--model-dir", model,
                     "--prefill", f"prefill-0=127.0.0.1:{ports['prefill']}",
                     "--decode", f"decode-0=127.0.0.1:{ports['decode-0']}",
                     "--decode", f"decode-1=127.0.0.1:{ports['decode-1']}",
                     "--max-inflight-requests", "16", "--max-queued-requests", "8"])
    try:
        deadline = time.time() + 120
        while get(ports["router"], "/health")[0] != 200:
            if time.time() > deadline:
                raise RuntimeError(f"the router never turned healthy (logs in {logs})")
            time.sleep(0.2)
        time.sleep(1.0)  # every agent polled at least once more
        model_name = os.path.basename(os.path.normpath(model))
        results = [None] * clients

        def client(i):
            path, body = body_of(i, model_name)
            start_time = time.time()
            results[i] = (post(ports["router"], path, body), time.time() - start_time)

        threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        time.sleep(0.5)
        statuses = {}
        for status, _ in results:
            statuses[str(status)] = statuses.get(str(status), 0) + 1
        return {
            "statuses": statuses,
            "served": statuses.get("200", 0),
            "decode_refusals": sum(metric(ports[name], "tandem_requests_total",
                                          'finish_reason="rejected"')
                                   for name in ("decode-0", "decode-1")),
            "prefill_computed_tokens": metric(ports["prefill"], "tandem_computed_tokens_total"),
            "slowest_client_s": round(max(seconds for _, seconds in results), 2),
        }
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGKILL)
        for proc in procs:
            proc.wait()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="models/small")
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json")
    parser.add_argument("builds", nargs="+")
    args = parser.parse_args()
    model = os.path.abspath(args.model)
    if not os.path.exists(os.path.join(model, "config.json")):
        sys.exit(f"no model at {model}: build/bin/tandem-model --preset small --out {model}")
    builds = [os.path.abspath(build) for build in args.builds]
    runs = {build: [] for build in builds}
    with tempfile.TemporaryDirectory(prefix="tandem-overload-") as logs:
        for round_ in range(args.rounds):
            for build in builds:
                result = measure(build, model, args.clients, logs)
                runs[build].append(result)
                print(f"round {round_ + 1} {build}: {json.dumps(result)}", flush=True)
    summary = {}
    for build in builds:
        summary[build] = {key: statistics.median(run[key] for run in runs[build])
                          for key in ("served", "decode_refusals", "prefill_computed_tokens",
                                      "slowest_client_s")}
        print(f"median {build}: {json.dumps(summary[build])}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"clients": args.clients, "rounds": args.rounds, "runs": runs,
                       "medians": summary}, out, indent=1)


if __name__ == "__main__":
    main()
