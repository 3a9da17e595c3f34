#!/usr/bin/env python3
"""Tests of torch_compare.py's plain parts: standard library only, no torch needed."""

import http.server
import json
import math
import os
import socket
import sys
import tempfile
import threading
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True  # no __pycache__ in the source tree

torch_was_loaded = "torch" in sys.modules
import torch_compare as tc  # noqa: E402


# What `tandem-bench engine --json` writes (the keys torch_compare reads, and others).
BENCH_BATCH1 = {
    "model": "/m/llama3-8b", "device": "cuda", "device_description": "NVIDIA H100",
    "prompt_tokens": 2048, "decode_tokens": 64, "batch": 1,
    "prefill_tokens_per_s": 626.0, "decode_tokens_per_s": 47.7, "decode_step_s": 0.02098,
    "decode_steps_recorded": True, "backend_copy_gbps": 1460.0,
}
BENCH_BATCH32 = dict(BENCH_BATCH1, prompt_tokens=512, batch=32, prefill_tokens_per_s=849.0,
                     decode_tokens_per_s=199.9, decode_step_s=0.1601)


def completion(token_ids, token_logprobs, tops):
    """A /v1/completions response shaped as the agent writes it."""
    return {"id": "cmpl-1", "object": "text_completion", "choices": [{
        "index": 0, "text": "...", "finish_reason": "length", "token_ids": token_ids,
        "logprobs": {"tokens": ["t"] * len(token_ids), "token_logprobs": token_logprobs,
                     "top_logprobs": tops, "text_offset": [0] * len(token_ids)}}]}


class TempDir(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)

    def write(self, name, value):
        path = os.path.join(self.tmp.name, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(value if isinstance(value, str) else json.dumps(value))
        return path

    def model_dir(self, vocab_tokens=50, vocab_size=64):
        self.write("model/config.json", {"vocab_size": vocab_size,
                                         "max_position_embeddings": 2048})
        vocab = {f"t{i}": i for i in range(vocab_tokens)}
        self.write("model/tokenizer.json", {"model": {"type": "BPE", "vocab": vocab}})
        return os.path.join(self.tmp.name, "model")


class MarginRuleTest(unittest.TestCase):
    def test_all_clear_and_equal(self):
        r = tc.margin_rule([5, 6, 7], [0.5, 0.2, 0.1], [5, 6, 7], 0.1)
        self.assertEqual((r["clear"], r["agreeing"], r["total"]), (3, 3, 3))
        self.assertTrue(r["ok"])
        self.assertIsNone(r["first_close"])
        self.assertIsNone(r["first_mismatch"])
        self.assertEqual(r["same_prefix"], 3)

    def test_assertions_end_at_the_first_close_call(self):
        # Step 1 is a near-tie: steps 1 and 2 are not asserted, so the
        # disagreement at step 2 is no failure.
        r = tc.margin_rule([5, 6, 7], [0.5, 0.05, 3.0], [5, 6, 9], 0.1)
        self.assertEqual((r["clear"], r["agreeing"], r["total"]), (1, 1, 3))
        self.assertEqual(r["first_close"], 1)
        self.assertIsNone(r["first_mismatch"])
        self.assertEqual(r["same_prefix"], 2)
        self.assertTrue(r["ok"])

    def test_a_disagreement_at_a_clear_position_fails_and_ends_assertions(self):
        r = tc.margin_rule([5, 6, 7, 8], [1.0, 1.0, 1.0, 1.0], [5, 4, 7, 8], 0.1)
        self.assertEqual((r["clear"], r["agreeing"], r["total"]), (2, 1, 4))
        self.assertEqual(r["first_mismatch"], 1)
        self.assertFalse(r["ok"])
        self.assertEqual(r["same_prefix"], 1)

    def test_gap_equal_to_the_margin_is_clear_and_nan_is_not(self):
        self.assertEqual(tc.margin_rule([1], [0.1], [1], 0.1)["clear"], 1)
        r = tc.margin_rule([1, 2], [math.nan, 1.0], [1, 2], 0.1)
        self.assertEqual((r["clear"], r["first_close"]), (0, 0))

    def test_missing_tandem_tokens_disagree(self):
        r = tc.margin_rule([1, 2, 3], [1.0, 1.0, 1.0], [1], 0.1)
        self.assertEqual((r["clear"], r["agreeing"], r["first_mismatch"]), (2, 1, 1))
        self.assertFalse(r["ok"])

    def test_gaps_and_tokens_must_pair(self):
        with self.assertRaises(ValueError):
            tc.margin_rule([1, 2], [1.0], [1, 2], 0.1)


class PerStepRuleTest(unittest.TestCase):
    def test_each_step_judged_on_its_own(self):
        r = tc.per_step_rule([1, 2, 3, 4], [1.0, 0.01, 1.0, 0.5], [1, 9, 7, 4], 0.1)
        # Step 1 is close (not asserted); step 2 is clear and differs.
        self.assertEqual((r["clear"], r["agreeing"], r["total"]), (3, 2, 4))
        self.assertEqual(r["mismatches"], [{"step": 2, "tandem": 7, "reference": 3, "gap": 1.0}])

    def test_lengths_must_match(self):
        with self.assertRaises(ValueError):
            tc.per_step_rule([1], [1.0], [1, 2], 0.1)


class TandemBenchTest(TempDir):
    def test_figures_of_a_batch1_run(self):
        f = tc.tandem_bench_figures(BENCH_BATCH1)
        self.assertEqual((f["prompt_tokens"], f["decode_tokens"], f["batch"]), (2048, 64, 1))
        self.assertEqual(f["prefill_tokens_per_s"], 626.0)
        self.assertAlmostEqual(f["decode_ms_per_step"], 20.98)
        self.assertEqual(f["decode_tokens_per_s"], 47.7)
        self.assertEqual(f["device"], "cuda")

    def test_missing_fields_are_named(self):
        bench = {k: v for k, v in BENCH_BATCH1.items() if k not in ("decode_step_s", "batch")}
        with self.assertRaises(tc.CompareError) as caught:
            tc.tandem_bench_figures(bench, "b.json")
        self.assertIn("b.json lacks batch, decode_step_s", str(caught.exception))

    def test_non_positive_values_are_refused(self):
        with self.assertRaises(tc.CompareError) as caught:
            tc.tandem_bench_figures(dict(BENCH_BATCH1, decode_step_s=0))
        self.assertIn("decode_step_s must be a positive number, got 0", str(caught.exception))

    def test_each_file_must_be_the_run_its_option_names(self):
        one = self.write("b1.json", BENCH_BATCH1)
        many = self.write("b32.json", BENCH_BATCH32)
        self.assertEqual(tc.read_tandem_bench(one, expect_batch_one=True)["batch"], 1)
        self.assertEqual(tc.read_tandem_bench(many, expect_batch_one=False)["batch"], 32)
        with self.assertRaises(tc.CompareError) as caught:
            tc.read_tandem_bench(many, expect_batch_one=True)
        self.assertIn("batch-32 run", str(caught.exception))
        with self.assertRaises(tc.CompareError):
            tc.read_tandem_bench(one, expect_batch_one=False)

    def test_unreadable_files_say_so(self):
        with self.assertRaises(tc.CompareError) as caught:
            tc.read_tandem_bench(os.path.join(self.tmp.name, "none.json"), True)
        self.assertIn("none.json", str(caught.exception))
        bad = self.write("bad.json", "{not json")
        with self.assertRaises(tc.CompareError) as caught:
            tc.read_tandem_bench(bad, True)
        self.assertIn("is not JSON", str(caught.exception))


class TandemTokensTest(TempDir):
    def test_completion_gives_ids_logprobs_and_sorted_top_values(self):
        response = completion([7, 8], [-0.5, -1.0],
                              [{"a": -2.0, "b": -0.5}, {"c": -1.0, "d": -3.0, "e": -1.5}])
        c = tc.tandem_choice(response, 2)
        self.assertEqual(c["token_ids"], [7, 8])
        self.assertEqual(c["token_logprobs"], [-0.5, -1.0])
        self.assertEqual(c["top_logprobs"], [[-0.5, -2.0], [-1.0, -1.5, -3.0]])

    def test_short_completions_are_refused(self):
        response = completion([7], [-0.5], [{"a": -0.5}])
        with self.assertRaises(tc.CompareError) as caught:
            tc.tandem_choice(response, 3)
        self.assertIn("expected 3", str(caught.exception))

    def test_completion_without_logprobs_is_refused(self):
        response = {"choices": [{"token_ids": [1], "logprobs": None}]}
        with self.assertRaises(tc.CompareError) as caught:
            tc.tandem_choice(response, 1)
        self.assertIn("token_ids or its logprobs", str(caught.exception))

    def test_tokens_file_fields_are_checked(self):
        good = self.write("t.json", {"steps": 1, "prompts": [
            {"prompt": [1], "token_ids": [2], "token_logprobs": [-1.0], "top_logprobs": [[-1.0]]}]})
        self.assertEqual(tc.read_tandem_tokens(good)["prompts"][0]["token_ids"], [2])
        bad = self.write("u.json", {"steps": 1, "prompts": [{"prompt": [1], "token_ids": [2]}]})
        with self.assertRaises(tc.CompareError) as caught:
            tc.read_tandem_tokens(bad)
        self.assertIn("prompts[0] lacks token_logprobs", str(caught.exception))
        with self.assertRaises(tc.CompareError) as caught:
            tc.read_tandem_tokens(self.write("v.json", [1, 2]))
        self.assertIn("no prompts list", str(caught.exception))
        short = self.write("w.json", {"steps": 2, "prompts": [
            {"prompt": [1], "token_ids": [2], "token_logprobs": [-1.0], "top_logprobs": [[-1.0]]}]})
        with self.assertRaises(tc.CompareError) as caught:
            tc.read_tandem_tokens(short)
        self.assertIn("steps must be a positive integer that every prompt's token_ids has",
                      str(caught.exception))


class PromptsTest(TempDir):
    def test_prompts_are_seeded_and_in_range(self):
        a = tc.fixed_prompts(7, [1, 5, 40], 100)
        self.assertEqual([len(p) for p in a], [1, 5, 40])
        self.assertTrue(all(0 <= t < 100 for p in a for t in p))
        self.assertEqual(a, tc.fixed_prompts(7, [1, 5, 40], 100))
        self.assertNotEqual(a, tc.fixed_prompts(8, [1, 5, 40], 100))

    def test_lengths(self):
        self.assertEqual(tc.parse_lengths("1,7, 40"), [1, 7, 40])
        for bad in ("", "0", "a,1", "-3"):
            with self.assertRaises(tc.CompareError):
                tc.parse_lengths(bad)

    def test_text_vocabulary_excludes_specials_and_is_capped_by_the_config(self):
        self.assertEqual(tc.text_vocab_size(self.model_dir(vocab_tokens=50, vocab_size=64)), 50)
        self.assertEqual(tc.text_vocab_size(self.model_dir(vocab_tokens=80, vocab_size=64)), 64)


class TableTest(unittest.TestCase):
    WORK = {"prompt": 2048, "decode": 64, "batch": 32, "batch_prompt": 512, "batch_decode": 64}

    def test_ratios_are_tandem_over_pytorch_per_variant(self):
        rows = tc.ratio_rows(
            {"prefill_tokens_per_s": 626.0, "decode_ms_per_token": 21.0,
             "batch_decode_tokens_per_s": 200.0},
            {"prefill_tokens_per_s": {"eager": 10000.0},
             "decode_ms_per_token": {"eager": 30.0, "CUDA graphs": 7.0},
             "batch_decode_tokens_per_s": {"eager": 400.0, "CUDA graphs": None}},
            self.WORK)
        by_label = {r["label"]: r for r in rows}
        self.assertEqual(len(rows), 5)
        prefill = by_label["prefill tok/s (2048-token prompt, batch 1), PyTorch eager"]
        self.assertAlmostEqual(prefill["ratio"], 0.0626)
        self.assertAlmostEqual(
            by_label["decode ms/token (batch 1, after 2048 tokens), PyTorch CUDA graphs"]["ratio"],
            3.0)
        self.assertAlmostEqual(
            by_label["decode ms/token (batch 1, after 2048 tokens), PyTorch eager"]["ratio"], 0.7)
        batch = "decode tok/s (batch 32, after 512-token prompts), PyTorch "
        self.assertAlmostEqual(by_label[batch + "eager"]["ratio"], 0.5)
        self.assertIsNone(by_label[batch + "CUDA graphs"]["ratio"])

    def test_missing_tandem_figures_give_no_ratio(self):
        rows = tc.ratio_rows({}, {"prefill_tokens_per_s": {"eager": 5.0}}, self.WORK)
        self.assertEqual(len(rows), 1)
        self.assertIsNone(rows[0]["tandem"])
        self.assertIsNone(rows[0]["ratio"])

    def test_table_lines_up_and_explains_the_ratios(self):
        rows = tc.ratio_rows({"prefill_tokens_per_s": 626.0, "decode_ms_per_token": 20.98},
                             {"prefill_tokens_per_s": {"eager": 12345.6},
                              "decode_ms_per_token": {"eager": 25.0}}, self.WORK)
        lines = tc.format_table(rows).splitlines()
        self.assertEqual(len(lines), 4)
        self.assertTrue(lines[0].startswith("figure"))
        self.assertTrue(lines[0].endswith("Tandem / PyTorch"))
        self.assertEqual(len({len(line) for line in lines[:3]}), 1)  # aligned columns
        self.assertIn("626.0", lines[1])
        self.assertIn("12,345.6", lines[1])
        self.assertTrue(lines[1].endswith("0.05"))
        self.assertIn("20.98", lines[2])
        self.assertTrue(lines[2].endswith("0.84"))
        self.assertIn("ratio above 1 means Tandem is faster", lines[3])
        self.assertIn("ms/token: a ratio above 1 means Tandem is slower", lines[3])

    def test_missing_values_print_a_dash(self):
        rows = tc.ratio_rows({}, {"prefill_tokens_per_s": {"eager": 5.0}}, self.WORK)
        self.assertRegex(tc.format_table(rows).splitlines()[1], r"^prefill .* - +5\.0 +-$")


class GemmTest(unittest.TestCase):
    # The ops.prefill table of `tandem-bench engine --profile-ops --json`.
    PROFILED = dict(BENCH_BATCH1, ops={"prefill": {"seconds_per_step": 1.0, "calls": [
        {"call": "matmul m=2048 k=4096 n=14336 bf16", "calls_per_step": 64.0,
         "seconds_per_step": 0.64, "bytes_per_step": 1.0, "flops_per_step": 64 * 2.0 * 2048 *
         4096 * 14336},
        {"call": "pagedAttention rows=2048 sequences=1 heads=32", "calls_per_step": 32.0,
         "seconds_per_step": 0.2, "bytes_per_step": 1.0, "flops_per_step": 0.0},
        {"call": "matmul m=1 k=4096 n=128256 bf16", "calls_per_step": 1.0,
         "seconds_per_step": 0.001, "bytes_per_step": 1.0, "flops_per_step": 2.0 * 4096 *
         128256},
    ]}})

    def test_matmul_shapes_and_times_per_call(self):
        shapes = tc.profiled_matmuls(self.PROFILED)
        self.assertEqual([(s["m"], s["k"], s["n"], s["dtype"]) for s in shapes],
                         [(2048, 4096, 14336, "bf16"), (1, 4096, 128256, "bf16")])
        self.assertAlmostEqual(shapes[0]["tandem_s_per_call"], 0.01)
        self.assertAlmostEqual(shapes[0]["tandem_gflops"], 2.0 * 2048 * 4096 * 14336 / 0.01 / 1e9)

    def test_a_run_without_the_profile_is_refused_by_name(self):
        with self.assertRaisesRegex(tc.CompareError, "--profile-ops"):
            tc.profiled_matmuls(BENCH_BATCH1, "b.json")
        bad = dict(BENCH_BATCH1, ops={"prefill": {"calls": [{"call": "matmul m=2 k=3",
                                                             "calls_per_step": 1,
                                                             "seconds_per_step": 1}]}})
        with self.assertRaisesRegex(tc.CompareError, "lacks m=, k=, n="):
            tc.profiled_matmuls(bad, "b.json")

    def test_rows_compare_speed_and_the_table_reads_them(self):
        shapes = tc.profiled_matmuls(self.PROFILED)
        rows = tc.gemm_rows(shapes, [0.0005, None])
        self.assertAlmostEqual(rows[0]["speed_ratio"], 0.05)  # 10 ms against 0.5 ms
        self.assertAlmostEqual(rows[0]["torch_ms"], 0.5)
        self.assertIsNone(rows[1]["speed_ratio"])
        table = tc.format_gemm_table(rows)
        self.assertIn("m=2048 k=4096 n=14336", table)
        self.assertIn("0.05", table)
        self.assertEqual(len({len(line) for line in table.splitlines()[:3]}), 1, table)


class ExactnessSummaryTest(unittest.TestCase):
    def test_sums_and_worst_errors(self):
        p1 = {"margin_rule": tc.margin_rule([1, 2], [1.0, 1.0], [1, 2], 0.1),
              "per_step": tc.per_step_rule([1, 2], [1.0, 1.0], [1, 2], 0.1),
              "last_position_top_error": 0.01, "chosen_logprob_max_error": 0.02}
        p2 = {"margin_rule": tc.margin_rule([1, 2], [1.0, 0.0], [3, 2], 0.1),
              "per_step": tc.per_step_rule([1, 2], [1.0, 0.0], [3, 2], 0.1),
              "last_position_top_error": 0.05, "chosen_logprob_max_error": None}
        s = tc.exactness_summary([p1, p2])
        self.assertEqual(s["margin_rule"], {"clear": 3, "agreeing": 2, "total": 4})
        self.assertEqual(s["per_step"], {"clear": 3, "agreeing": 2, "total": 4})
        self.assertFalse(s["ok"])
        self.assertEqual(s["last_position_top_error_max"], 0.05)
        self.assertEqual(s["chosen_logprob_error_max"], 0.02)
        self.assertTrue(tc.exactness_summary([p1])["ok"])

    def test_top_values_error(self):
        self.assertAlmostEqual(tc.top_values_error([-0.1, -2.0, -3.0], [-0.15, -2.5], 10), 0.5)
        self.assertIsNone(tc.top_values_error([], [-1.0], 10))


class FakeAgent(http.server.BaseHTTPRequestHandler):
    """Answers as tandem-agent does; greedy tokens count up from the prompt's last, modulo 50."""

    requests = []

    def log_message(self, *args):
        pass

    def reply(self, body):
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/v1/models":
            self.reply({"data": [{"id": "small"}]})
        else:
            self.reply({"status": "ok", "device": "cuda", "device_description": "fake GPU"})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        FakeAgent.requests.append(body)
        last = body["prompt"][-1]
        ids = [(last + 1 + i) % 50 for i in range(body["max_tokens"])]
        self.reply(completion(ids, [-0.25] * len(ids), [{"x": -0.25, "y": -2.0}] * len(ids)))


class FetchTandemTest(TempDir):
    def test_fetch_writes_prompts_tokens_and_logprobs(self):
        server = http.server.HTTPServer(("127.0.0.1", 0), FakeAgent)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        self.addCleanup(thread.join)
        self.addCleanup(server.server_close)
        self.addCleanup(server.shutdown)
        FakeAgent.requests = []
        out = os.path.join(self.tmp.name, "t.json")
        model = self.model_dir(vocab_tokens=50)
        rc = tc.main(["fetch-tandem", "--url", f"http://127.0.0.1:{server.server_port}/",
                      "--model", model, "--out", out, "--lengths", "3,4", "--steps", "5",
                      "--seed", "11"])
        self.assertEqual(rc, 0)
        data = tc.read_tandem_tokens(out)
        prompts = tc.fixed_prompts(11, [3, 4], 50)
        self.assertEqual([p["prompt"] for p in data["prompts"]], prompts)
        self.assertEqual(data["prompts"][0]["token_ids"],
                         [(prompts[0][-1] + 1 + i) % 50 for i in range(5)])
        self.assertEqual(data["prompts"][1]["top_logprobs"][0], [-0.25, -2.0])
        self.assertEqual((data["device"], data["steps"], data["served_model"]),
                         ("cuda", 5, "small"))
        # Greedy, the whole length, ids back, 20 alternatives.
        for body in FakeAgent.requests:
            self.assertEqual((body["temperature"], body["ignore_eos"], body["return_token_ids"],
                              body["logprobs"], body["max_tokens"], body["model"]),
                             (0, True, True, 20, 5, "small"))

    def test_an_unreachable_agent_is_exit_2_and_no_file(self):
        # A port that was just free: nothing listens there.
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        probe.close()
        out = os.path.join(self.tmp.name, "t.json")
        rc = tc.main(["fetch-tandem", "--url", f"http://127.0.0.1:{port}", "--model",
                      self.model_dir(), "--out", out])
        self.assertEqual(rc, 2)
        self.assertFalse(os.path.exists(out))


class TokenRangeTest(unittest.TestCase):
    def test_ids_outside_the_vocabulary_are_named(self):
        data = {"prompts": [{"prompt": [1, 2], "token_ids": [3, 64]}]}
        with self.assertRaises(tc.CompareError) as caught:
            tc.check_token_ids(data, 64)
        self.assertIn("prompts[0].token_ids holds 64, outside the model's vocabulary [0, 64)",
                      str(caught.exception))
        tc.check_token_ids({"prompts": [{"prompt": [0], "token_ids": [63]}]}, 64)


class LazyTorchTest(unittest.TestCase):
    def test_importing_the_script_does_not_import_torch(self):
        if torch_was_loaded:
            self.skipTest("torch was imported before the script")
        self.assertNotIn("torch", sys.modules)
        self.assertNotIn("transformers", sys.modules)


if __name__ == "__main__":
    unittest.main()
