#!/usr/bin/env python3
"""The GPU engine's figures against their goals, from one gpu-check run.

Usage: gpu_goals.py JSON_DIR [--model llama3-8b] [--exclude fast,flash]

Reads what scripts/gpu-check.sh left in JSON_DIR (BENCH_JSON_DIR): the
`tandem-bench engine --json` runs engine-MODEL-batchB[-VARIANT].json and
scripts/torch_compare.py's torch-MODEL.json, and prints one table:

- per kernel variant, batch-1 and batch-32 decode: (weight + KV bytes per
  step / step time) / the device copy's read + write traffic, measured in
  the same run (goals 0.80 and 0.70), and batch-1 prefill tok/s;
- prefill tok/s / PyTorch's and batch-1 decode ms/token / PyTorch's, same
  run (goals >= 0.8 and <= 0.8; against each PyTorch variant printed, the
  goal judged on the least favourable one);
- the two PyTorch ratios again for the candidates' run (the next defaults
  on trial, -flash-bf16-fused-deep), where it ran: what the goals would
  read if the candidates served;
- greedy tokens against PyTorch's at positions with a clear margin (goal:
  all agree).

A kernel set whose checks failed (gpu-check's --exclude) is shown but never
counts towards a goal, nor do the PyTorch ratios when Tandem's side of them
ran it (the greedy tokens come from the agent's own kernels and always
count). Missing files print as "-"; gpu-check removes a model's files
before its runs, so every file read is from the same run. Plain Python (no
torch), tested by scripts/test_gpu_goals.py.
"""

import argparse
import json
import os
import sys

# Kernel variants in the order gpu-check runs them: file suffix, label.
VARIANTS = [
    ("", "reference"),
    ("-fast", "fast"),
    ("-fast-bf16", "fast, bf16 compute"),
    ("-fast-bf16-fused", "fast, bf16 compute, fused projections"),
    ("-flash-bf16-fused", "flash, bf16 compute, fused projections"),
    ("-flash-bf16-fused-deep",
     "flash, bf16 compute, fused projections, deep decode and attention loads, compact "
     "attention grid"),
]
# The unordered split-K run (-fast-bf16-unordered) measures what batch
# invariance costs and never serves: it is not a variant here.

DECODE_GOAL = {1: 0.80, 32: 0.70}
PREFILL_GOAL = 0.8
DECODE_MS_GOAL = 0.8


def read_json(path):
    """The file's JSON, or None when it is missing or unreadable."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def decode_over_copy(run):
    """(weights + KV) per decode step over the copy traffic, from a bench run.

    Older runs lack the figure; it is the weight-only ratio scaled by the
    bytes."""
    if run is None:
        return None
    if "decode_total_stream_over_backend_copy_traffic" in run:
        return run["decode_total_stream_over_backend_copy_traffic"]
    weights = run.get("decode_weight_bytes_per_step")
    kv = run.get("decode_kv_bytes_per_step")
    ratio = run.get("decode_stream_over_backend_copy_traffic")
    if weights and kv is not None and ratio is not None:
        return ratio * (1.0 + kv / weights)
    return None


def family(suffix):
    """"fast", "flash", "reference", or "candidates" (the run with the
    candidates for the next defaults, -deep): a variant's kernel set, by its
    suffix."""
    if suffix.endswith("-deep"):
        return "candidates"
    return suffix.split("-")[1] if suffix else "reference"


def variant_rows(json_dir, model, excluded):
    """One row per variant: its label, the figures, and whether it counts."""
    rows = []
    for suffix, label in VARIANTS:
        one = read_json(os.path.join(json_dir, f"engine-{model}-batch1{suffix}.json"))
        many = read_json(os.path.join(json_dir, f"engine-{model}-batch32{suffix}.json"))
        if one is None and many is None:
            continue
        rows.append({
            "variant": label,
            "counts": family(suffix) not in excluded,
            "prefill_tokens_per_s": one and one.get("prefill_tokens_per_s"),
            "decode_over_copy": {1: decode_over_copy(one), 32: decode_over_copy(many)},
        })
    return rows


def best(values, higher_is_better=True):
    values = [v for v in values if v is not None]
    if not values:
        return None
    return max(values) if higher_is_better else min(values)


def goal_rows(json_dir, model, excluded=()):
    """The goal table: figure, value, goal text, met (True/False/None)."""
    variants = variant_rows(json_dir, model, set(excluded))
    counting = [v for v in variants if v["counts"]]
    goals = []
    for batch in (1, 32):
        value = best(v["decode_over_copy"][batch] for v in counting)
        goals.append({"figure": f"batch-{batch} decode: weights + KV / copy traffic",
                      "value": value, "goal": f">= {DECODE_GOAL[batch]:.2f}",
                      "met": None if value is None else value >= DECODE_GOAL[batch]})
    torch = read_json(os.path.join(json_dir, f"torch-{model}.json")) or {}
    figures = torch.get("figures") or []
    # Tandem's side of the comparison is one bench run (torch_compare keeps
    # it): when its kernel set's checks failed, its figures judge nothing.
    side = (torch.get("tandem_bench") or {}).get("cuda_kernels")
    side_counts = side not in excluded

    def judged(value, met):
        return None if value is None or not side_counts else met

    def ratios(key):
        return [r.get("ratio") for r in figures if r.get("figure") == key]

    prefill = ratios("prefill_tokens_per_s")
    # The least favourable PyTorch variant decides.
    value = best(prefill, higher_is_better=False)
    note = "" if side_counts else f" (Tandem side: {side}, whose checks failed)"
    goals.append({"figure": "prefill tok/s / PyTorch (same run)" + note, "value": value,
                  "goal": f">= {PREFILL_GOAL}",
                  "met": judged(value, value is not None and value >= PREFILL_GOAL)})
    value = best(ratios("decode_ms_per_token"))  # the largest ms ratio is the least favourable
    goals.append({"figure": "batch-1 decode ms/token / PyTorch (same run)" + note, "value": value,
                  "goal": f"<= {DECODE_MS_GOAL}",
                  "met": judged(value, value is not None and value <= DECODE_MS_GOAL)})
    goals += candidate_goals(json_dir, model, figures, "candidates" not in excluded)
    rule = ((torch.get("exactness") or {}).get("margin_rule")) or {}
    clear, agreeing = rule.get("clear"), rule.get("agreeing")
    value = None if not clear else agreeing / clear
    goals.append({"figure": "greedy tokens = PyTorch's, clear-margin positions", "value": value,
                  "goal": "100 %", "met": None if value is None else agreeing == clear,
                  "detail": None if not clear else f"{agreeing}/{clear}"})
    return variants, goals


def candidate_goals(json_dir, model, figures, counts):
    """The two PyTorch goals again for the candidates' run (-flash-bf16-fused-deep):
    its prefill tok/s and batch-1 decode ms over PyTorch's figures of the
    same run (the least favourable PyTorch variant), what the goals would
    read if the candidates served. None where a side is missing; not judged
    when the candidates' checks failed."""
    run = read_json(os.path.join(json_dir, f"engine-{model}-batch1-flash-bf16-fused-deep.json"))
    if run is None:
        return []

    def torch_values(key):
        return [r.get("torch") for r in figures if r.get("figure") == key and r.get("torch")]

    rows = []
    prefill = run.get("prefill_tokens_per_s")
    fastest = best(torch_values("prefill_tokens_per_s"))
    value = prefill / fastest if prefill and fastest else None
    rows.append(("prefill tok/s / PyTorch (same run), the candidates' run", value,
                 f">= {PREFILL_GOAL}", value is not None and value >= PREFILL_GOAL))
    step = run.get("decode_step_s")
    fastest = best(torch_values("decode_ms_per_token"), higher_is_better=False)
    value = step * 1e3 / fastest if step and fastest else None
    rows.append(("batch-1 decode ms/token / PyTorch (same run), the candidates' run", value,
                 f"<= {DECODE_MS_GOAL}", value is not None and value <= DECODE_MS_GOAL))
    note = "" if counts else " (candidates' checks failed)"
    return [{"figure": figure + note, "value": value, "goal": goal,
             "met": met if value is not None and counts else None}
            for figure, value, goal, met in rows]


def _figure(value, digits=2):
    return "-" if value is None else f"{value:,.{digits}f}"


def format_tables(model, variants, goals):
    lines = [f"GPU engine figures, {model} (one run; decode ratios over the device copy's "
             "read + write traffic measured in it):",
             "| variant | prefill tok/s (batch 1) | batch-1 decode ÷ copy | batch-32 decode ÷ copy |",
             "| --- | ---: | ---: | ---: |"]
    for v in variants:
        label = v["variant"] + ("" if v["counts"] else " (checks failed: not counted)")
        lines.append(f"| {label} | {_figure(v['prefill_tokens_per_s'], 1)} | "
                     f"{_figure(v['decode_over_copy'][1])} | {_figure(v['decode_over_copy'][32])} |")
    lines += ["", "| figure | value | goal | met |", "| --- | ---: | --- | --- |"]
    for g in goals:
        value = g.get("detail") or _figure(g["value"])
        met = "-" if g["met"] is None else ("yes" if g["met"] else "NO")
        lines.append(f"| {g['figure']} | {value} | {g['goal']} | {met} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("json_dir")
    parser.add_argument("--model", default="llama3-8b")
    parser.add_argument("--exclude", default="",
                        help="comma-separated kernel sets whose checks failed "
                        "(reference, fast, flash, candidates)")
    args = parser.parse_args(argv)
    excluded = [e for e in args.exclude.split(",") if e]
    variants, goals = goal_rows(args.json_dir, args.model, excluded)
    if not variants:
        print(f"gpu_goals: no engine-{args.model}-*.json in {args.json_dir}")
        return 0
    print(format_tables(args.model, variants, goals))
    return 0


if __name__ == "__main__":
    sys.exit(main())
