#!/usr/bin/env python3
"""Tests of gpu_goals.py: standard library only."""

import io
import json
import os
import sys
import tempfile
import unittest
from contextlib import redirect_stdout

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True  # no __pycache__ in the source tree

import gpu_goals as gg  # noqa: E402


def bench(prefill, total_over_copy=None, weight_over_copy=None, weights=15e9, kv=0.3e9):
    """What `tandem-bench engine --json` writes, the keys gpu_goals reads."""
    run = {"prefill_tokens_per_s": prefill, "decode_weight_bytes_per_step": weights,
           "decode_kv_bytes_per_step": kv}
    if total_over_copy is not None:
        run["decode_total_stream_over_backend_copy_traffic"] = total_over_copy
    if weight_over_copy is not None:
        run["decode_stream_over_backend_copy_traffic"] = weight_over_copy
    return run


class GoalsTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)

    def write(self, name, value):
        with open(os.path.join(self.dir.name, name), "w", encoding="utf-8") as f:
            json.dump(value, f)

    def goals(self, excluded=()):
        variants, goals = gg.goal_rows(self.dir.name, "llama3-8b", excluded)
        return variants, {g["figure"]: g for g in goals}

    def test_the_best_counting_variant_decides_each_decode_goal(self):
        self.write("engine-llama3-8b-batch1.json", bench(626.0, 0.19))
        self.write("engine-llama3-8b-batch32.json", bench(847.0, 0.03))
        self.write("engine-llama3-8b-batch1-fast-bf16-fused.json", bench(9000.0, 0.83))
        self.write("engine-llama3-8b-batch32-fast-bf16-fused.json", bench(8000.0, 0.65))
        self.write("engine-llama3-8b-batch1-flash-bf16-fused.json", bench(12000.0, 0.85))
        self.write("engine-llama3-8b-batch32-flash-bf16-fused.json", bench(9000.0, 0.72))
        # The unordered run never counts, however fast.
        self.write("engine-llama3-8b-batch32-fast-bf16-unordered.json", bench(9000.0, 0.99))
        variants, goals = self.goals()
        self.assertEqual([v["variant"] for v in variants],
                         ["reference", "fast, bf16 compute, fused projections",
                          "flash, bf16 compute, fused projections"])
        one = goals["batch-1 decode: weights + KV / copy traffic"]
        many = goals["batch-32 decode: weights + KV / copy traffic"]
        self.assertEqual((one["value"], one["met"]), (0.85, True))
        self.assertEqual((many["value"], many["met"]), (0.72, True))
        # With flash's checks failed, fast's figures decide: batch 32 misses.
        variants, goals = self.goals(excluded=["flash"])
        self.assertFalse(variants[2]["counts"])
        many = goals["batch-32 decode: weights + KV / copy traffic"]
        self.assertEqual((many["value"], many["met"]), (0.65, False))

    def test_the_candidates_count_apart_from_the_flash_kernels(self):
        self.write("engine-llama3-8b-batch1-flash-bf16-fused.json", bench(12000.0, 0.5))
        self.write("engine-llama3-8b-batch1-flash-bf16-fused-deep.json", bench(14000.0, 0.6))
        variants, goals = self.goals()
        self.assertEqual([v["counts"] for v in variants], [True, True])
        self.assertEqual(goals["batch-1 decode: weights + KV / copy traffic"]["value"], 0.6)
        # A candidate's check failed: the serving flash run still counts.
        variants, goals = self.goals(excluded=["candidates"])
        self.assertEqual([v["counts"] for v in variants], [True, False])
        self.assertEqual(goals["batch-1 decode: weights + KV / copy traffic"]["value"], 0.5)

    def test_the_candidates_run_is_set_against_the_same_pytorch_figures(self):
        self.write("engine-llama3-8b-batch1-flash-bf16-fused.json", bench(13000.0, 0.5))
        deep = bench(26000.0, 0.6)
        deep["decode_step_s"] = 0.0070
        self.write("engine-llama3-8b-batch1-flash-bf16-fused-deep.json", deep)
        self.write("torch-llama3-8b.json", {"figures": [
            {"figure": "prefill_tokens_per_s", "torch": 34000.0, "ratio": 0.38},
            {"figure": "decode_ms_per_token", "torch": 23.0, "ratio": 0.3},   # eager
            {"figure": "decode_ms_per_token", "torch": 9.0, "ratio": 0.85}],  # CUDA graphs
            "tandem_bench": {"cuda_kernels": "flash"}})
        _, goals = self.goals()
        prefill = goals["prefill tok/s / PyTorch (same run), the candidates' run"]
        self.assertAlmostEqual(prefill["value"], 26000.0 / 34000.0)
        self.assertFalse(prefill["met"])
        decode = goals["batch-1 decode ms/token / PyTorch (same run), the candidates' run"]
        self.assertAlmostEqual(decode["value"], 7.0 / 9.0)  # against the faster PyTorch
        self.assertTrue(decode["met"])
        _, goals = self.goals(excluded=["candidates"])
        decode = goals["batch-1 decode ms/token / PyTorch (same run), the candidates' run "
                       "(candidates' checks failed)"]
        self.assertIsNone(decode["met"])

    def test_a_failed_reference_does_not_count(self):
        self.write("engine-llama3-8b-batch1.json", bench(626.0, 0.9))
        _, goals = self.goals(excluded=["reference"])
        self.assertIsNone(goals["batch-1 decode: weights + KV / copy traffic"]["value"])

    def test_an_older_run_gives_the_figure_from_its_weight_ratio_and_bytes(self):
        self.write("engine-llama3-8b-batch1-fast.json",
                   bench(626.0, weight_over_copy=0.5, weights=10e9, kv=1e9))
        _, goals = self.goals()
        self.assertAlmostEqual(goals["batch-1 decode: weights + KV / copy traffic"]["value"], 0.55)
        self.assertIsNone(goals["batch-32 decode: weights + KV / copy traffic"]["met"])

    def test_pytorch_ratios_are_judged_on_the_least_favourable_variant(self):
        self.write("engine-llama3-8b-batch1-fast-bf16.json", bench(9000.0, 0.8))
        self.write("torch-llama3-8b.json", {
            "figures": [
                {"figure": "prefill_tokens_per_s", "ratio": 0.9},
                {"figure": "decode_ms_per_token", "ratio": 0.7},   # PyTorch eager
                {"figure": "decode_ms_per_token", "ratio": 0.95},  # PyTorch CUDA graphs
                {"figure": "batch_decode_tokens_per_s", "ratio": 2.0}],
            "exactness": {"margin_rule": {"clear": 250, "agreeing": 249}},
            "tandem_bench": {"cuda_kernels": "fast"}})
        _, goals = self.goals()
        prefill = goals["prefill tok/s / PyTorch (same run)"]
        self.assertEqual((prefill["value"], prefill["met"]), (0.9, True))
        decode = goals["batch-1 decode ms/token / PyTorch (same run)"]
        self.assertEqual((decode["value"], decode["met"]), (0.95, False))
        tokens = goals["greedy tokens = PyTorch's, clear-margin positions"]
        self.assertEqual((tokens["detail"], tokens["met"]), ("249/250", False))
        # Tandem's side ran the fast kernels, whose checks failed: shown, not judged.
        _, goals = self.goals(excluded=["fast"])
        prefill = goals["prefill tok/s / PyTorch (same run) (Tandem side: fast, whose checks failed)"]
        self.assertEqual((prefill["value"], prefill["met"]), (0.9, None))

    def test_missing_files_print_dashes_and_judge_nothing(self):
        self.write("engine-llama3-8b-batch1-fast-bf16.json", bench(9000.0, 0.8))
        out = io.StringIO()
        with redirect_stdout(out):
            self.assertEqual(gg.main([self.dir.name]), 0)
        text = out.getvalue()
        self.assertIn("| fast, bf16 compute | 9,000.0 | 0.80 | - |", text)
        self.assertIn("| prefill tok/s / PyTorch (same run) | - | >= 0.8 | - |", text)
        out = io.StringIO()
        with redirect_stdout(out):
            self.assertEqual(gg.main([self.dir.name, "--model", "small"]), 0)
        self.assertIn("no engine-small-*.json", out.getvalue())


if __name__ == "__main__":
    unittest.main()
