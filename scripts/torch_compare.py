#!/usr/bin/env python3
"""Tandem's engine next to PyTorch + transformers on the same model directory.

  torch_compare.py fetch-tandem --url U --model DIR --out T.json
      [--lengths 1,7,40,128,300,1000] [--steps 32] [--seed 7]
      Tandem's greedy tokens and log-probabilities for fixed token-id prompts
      (random ids from the seed), from a running `tandem-agent serve`
      (/v1/completions, temperature 0, logprobs 20, return_token_ids).
      Standard library only.
  torch_compare.py compare --model DIR [--device cuda] [--dtype bf16]
      [--tandem-bench B1.json] [--tandem-bench-batch B32.json]
      [--tandem-tokens T.json] [--tandem-bench-gemm G.json] [--margin 0.1]
      [--repeats 3] [--warmup 1] [--cuda-graphs auto|off] [--out R.json]
      Loads DIR with transformers (LlamaForCausalLM through AutoModelForCausalLM,
      attn_implementation="sdpa", a StaticCache), measures prefill tokens/s,
      batch-1 decode ms/token and batch-N decode tokens/s on the workloads the
      `tandem-bench engine --json` files name (defaults: a 2048-token prompt,
      64 decode steps, batch 32 after 512-token prompts), each after warm-up and
      best of --repeats with torch.cuda.synchronize() around every timing; runs
      the prompts of T.json greedily and applies the margin rule to Tandem's
      tokens; prints Tandem, PyTorch and Tandem / PyTorch for each figure and
      writes everything to --out. Exits 1 when a position the margin rule
      asserts disagrees. With G.json (a `tandem-bench engine --profile-ops
      --json` run, e.g. the bf16-compute one), also each matmul shape of its
      prefill table next to torch.nn.functional.linear on random bf16
      operands of the same shape (cuBLAS: no batch-invariance constraint),
      timed with CUDA events: the cost of Tandem's fixed summation order.

Only the functions that run the model import torch; the rest (margin rule,
reading Tandem's JSON, the ratio table) are plain Python, tested by
scripts/test_torch_compare.py.
"""

import argparse
import json
import math
import os
import random
import sys
import time
import urllib.error
import urllib.request

# Positions of the margin rule are asserted while the reference's best logit
# leads the second by at least this much at every step so far. bf16 logits of
# magnitude 1-8 are spaced 0.008-0.06 apart; 0.1 is above the rounding of the
# two engines' different summation orders on the test models.
DEFAULT_MARGIN = 0.1
DEFAULT_LENGTHS = "1,7,40,128,300,1000"
DEFAULT_STEPS = 32
DEFAULT_SEED = 7
TOP_LOGPROBS = 20  # what the agent's /v1/completions returns at most
COMPARED_TOP = 10  # top log-probabilities compared at the last prompt position

# Workloads when no tandem-bench JSON names them (gpu-check.sh's).
DEFAULT_PROMPT_TOKENS = 2048
DEFAULT_DECODE_TOKENS = 64
DEFAULT_BATCH = 32
DEFAULT_BATCH_PROMPT_TOKENS = 512


class CompareError(Exception):
    """A user-caused problem: bad input file, missing field, unsupported library."""


# ---- pure parts -------------------------------------------------------------------------


def parse_lengths(text):
    try:
        lengths = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise CompareError(f"--lengths must be comma-separated positive integers, got {text!r}")
    if not lengths or any(n < 1 for n in lengths):
        raise CompareError(f"--lengths must be comma-separated positive integers, got {text!r}")
    return lengths


def fixed_prompts(seed, lengths, vocab):
    """Token-id prompts drawn from [0, vocab) by a seeded generator: the same on every machine."""
    if vocab < 1:
        raise CompareError(f"the tokenizer's vocabulary must hold at least one token, got {vocab}")
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(n)] for n in lengths]


def load_json(path, what):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as error:
        raise CompareError(f"{what} {path}: {error.strerror}")
    except json.JSONDecodeError as error:
        raise CompareError(f"{what} {path} is not JSON: {error}")


def text_vocab_size(model_dir):
    """Ids of real text tokens, [0, n): the tokenizer's BPE vocabulary (specials come after)."""
    tokenizer = load_json(os.path.join(model_dir, "tokenizer.json"), "tokenizer")
    vocab = tokenizer.get("model", {}).get("vocab")
    if not isinstance(vocab, dict) or not vocab:
        raise CompareError(f"{model_dir}/tokenizer.json has no model.vocab object")
    config = load_json(os.path.join(model_dir, "config.json"), "model config")
    return min(len(vocab), int(config.get("vocab_size", len(vocab))))


def tandem_bench_figures(bench, source="tandem-bench JSON"):
    """The figures compared, from one `tandem-bench engine --json` object.

    Returns prefill tokens/s, decode ms per step (= ms per token per sequence),
    decode tokens/s over all sequences, and the workload that produced them.
    """
    required = ("prompt_tokens", "decode_tokens", "batch", "prefill_tokens_per_s",
                "decode_tokens_per_s", "decode_step_s")
    missing = [k for k in required if k not in bench]
    if missing:
        raise CompareError(f"{source} lacks {', '.join(missing)} "
                           "(is it tandem-bench engine --json?)")
    for key in required:
        value = bench[key]
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
            raise CompareError(f"{source}: {key} must be a positive number, got {value!r}")
    return {
        "prompt_tokens": int(bench["prompt_tokens"]),
        "decode_tokens": int(bench["decode_tokens"]),
        "batch": int(bench["batch"]),
        "prefill_tokens_per_s": float(bench["prefill_tokens_per_s"]),
        "decode_ms_per_step": float(bench["decode_step_s"]) * 1e3,
        "decode_tokens_per_s": float(bench["decode_tokens_per_s"]),
        "device": bench.get("device"),
        "device_description": bench.get("device_description"),
        "decode_steps_recorded": bench.get("decode_steps_recorded"),
    }


def profiled_matmuls(bench, source="tandem-bench JSON"):
    """Each matmul shape of a `tandem-bench engine --profile-ops` prefill table.

    Returns dicts with m, k, n, the weight dtype, calls per prefill, Tandem's
    seconds per call and GFLOP/s (each call timed alone, with a device
    synchronization around it), slowest total first as in the table.
    """
    ops = (bench.get("ops") or {}).get("prefill")
    if not ops:
        raise CompareError(f"{source} has no ops.prefill table (run tandem-bench engine with "
                           "--profile-ops)")
    shapes = []
    for call in ops.get("calls", []):
        name = call.get("call", "")
        words = name.split()
        if not words or words[0] != "matmul":
            continue
        dims = dict(word.split("=", 1) for word in words[1:] if "=" in word)
        try:
            m, k, n = int(dims["m"]), int(dims["k"]), int(dims["n"])
            calls = float(call["calls_per_step"])
            seconds = float(call["seconds_per_step"])
            flops = float(call.get("flops_per_step", 0.0))
        except (KeyError, ValueError, TypeError):
            raise CompareError(f"{source}: profiled call {name!r} lacks m=, k=, n= or its "
                               "calls_per_step and seconds_per_step")
        if calls <= 0 or seconds <= 0:
            raise CompareError(f"{source}: profiled call {name!r} has no calls or no time")
        shapes.append({"m": m, "k": k, "n": n, "dtype": words[-1] if "=" not in words[-1]
                       else None, "calls": calls, "tandem_s_per_call": seconds / calls,
                       "tandem_gflops": flops / seconds / 1e9 if flops > 0 else None})
    return shapes


def gemm_rows(shapes, torch_seconds):
    """Per shape: Tandem's and PyTorch's ms per call and GFLOP/s, and Tandem / PyTorch speed."""
    rows = []
    for shape, torch_s in zip(shapes, torch_seconds):
        flops = 2.0 * shape["m"] * shape["k"] * shape["n"]
        torch_gflops = flops / torch_s / 1e9 if torch_s else None
        tandem_gflops = flops / shape["tandem_s_per_call"] / 1e9
        rows.append({"shape": f"m={shape['m']} k={shape['k']} n={shape['n']}",
                     "calls": shape["calls"], "tandem_ms": shape["tandem_s_per_call"] * 1e3,
                     "torch_ms": None if torch_s is None else torch_s * 1e3,
                     "tandem_gflops": tandem_gflops, "torch_gflops": torch_gflops,
                     "speed_ratio": tandem_gflops / torch_gflops if torch_gflops else None})
    return rows


def format_gemm_table(rows):
    header = ("matmul", "per prefill", "Tandem ms", "PyTorch ms", "Tandem GFLOP/s",
              "PyTorch GFLOP/s", "Tandem / PyTorch")
    body = [(r["shape"], f"{r['calls']:g}", _number(r["tandem_ms"], "ms"),
             _number(r["torch_ms"], "ms"), _number(r["tandem_gflops"], ""),
             _number(r["torch_gflops"], ""),
             "-" if r["speed_ratio"] is None else f"{r['speed_ratio']:.2f}") for r in rows]
    widths = [max(len(line[i]) for line in [header] + body) for i in range(len(header))]
    lines = ["  ".join([line[0].ljust(widths[0])] + [line[i].rjust(widths[i])
                                                    for i in range(1, len(header))])
             for line in [header] + body]
    lines.append("(Tandem: each call timed alone with a synchronization around it; PyTorch: "
                 "torch.nn.functional.linear on random operands of the same shape and dtype, "
                 "CUDA events over back-to-back calls; a ratio above 1 means Tandem is faster)")
    return "\n".join(lines)


def read_tandem_bench(path, expect_batch_one):
    figures = tandem_bench_figures(load_json(path, "tandem-bench JSON"), path)
    if expect_batch_one and figures["batch"] != 1:
        raise CompareError(f"{path} is a batch-{figures['batch']} run; --tandem-bench takes "
                           "the batch-1 run (--tandem-bench-batch the other)")
    if not expect_batch_one and figures["batch"] == 1:
        raise CompareError(f"{path} is a batch-1 run; --tandem-bench-batch takes a run with "
                           "--batch above 1")
    return figures


def tandem_choice(response, steps):
    """Greedy tokens and log-probabilities of one /v1/completions response.

    top_logprobs maps token text to log-probability (several ids can share a
    text), so only the values are kept, sorted from the largest.
    """
    try:
        choice = response["choices"][0]
        token_ids = [int(t) for t in choice["token_ids"]]
        logprobs = choice["logprobs"]
        token_logprobs = [float(x) for x in logprobs["token_logprobs"]]
        top = [sorted((float(v) for v in step.values()), reverse=True)
               for step in logprobs["top_logprobs"]]
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as error:
        raise CompareError("the completion lacks choices[0].token_ids or its logprobs "
                           f"(token_logprobs, top_logprobs): {error!r}")
    if len(token_ids) != steps or len(token_logprobs) != steps or len(top) != steps:
        raise CompareError(f"the completion has {len(token_ids)} tokens, {len(token_logprobs)} "
                           f"token_logprobs and {len(top)} top_logprobs; expected {steps} of "
                           "each (is ignore_eos honoured?)")
    return {"token_ids": token_ids, "token_logprobs": token_logprobs, "top_logprobs": top}


def read_tandem_tokens(path):
    data = load_json(path, "Tandem tokens JSON")
    try:
        prompts = data["prompts"]
        for i, p in enumerate(prompts):
            for key in ("prompt", "token_ids", "token_logprobs", "top_logprobs"):
                if key not in p:
                    raise CompareError(f"{path}: prompts[{i}] lacks {key}")
    except (KeyError, TypeError):
        raise CompareError(f"{path} has no prompts list (write it with "
                           "torch_compare.py fetch-tandem)")
    steps = data.get("steps")
    if not isinstance(steps, int) or steps < 1 or not prompts or any(
            len(p["token_ids"]) != steps for p in prompts):
        raise CompareError(f"{path}: steps must be a positive integer that every prompt's "
                           f"token_ids has, got steps {steps!r}")
    return data


def check_token_ids(data, vocab_size):
    """Every prompt and Tandem token id of a fetch-tandem file lies in [0, vocab_size)."""
    for i, entry in enumerate(data["prompts"]):
        for key in ("prompt", "token_ids"):
            bad = [t for t in entry[key] if not 0 <= t < vocab_size]
            if bad:
                raise CompareError(f"prompts[{i}].{key} holds {bad[0]}, outside the model's "
                                   f"vocabulary [0, {vocab_size}): is the file for another model?")


def margin_rule(reference_tokens, reference_gaps, tandem_tokens, margin):
    """Greedy tokens of two engines, each decoding on its own, judged by the reference.

    Position i is asserted only while every step 0..i had a clear winner in the
    reference (its best logit ahead of the second by at least `margin`). The
    first disagreement at an asserted position also ends the assertions: the
    two engines continue from different contexts after it.

    Returns counts: `clear` (positions asserted), `agreeing` (of those, equal
    tokens), `total` (reference steps), the first close call and the first
    disagreement (None when there is none), and `ok`.
    """
    if len(reference_gaps) != len(reference_tokens):
        raise ValueError("one gap per reference token")
    clear = agreeing = 0
    first_close = first_mismatch = None
    for i, (token, gap) in enumerate(zip(reference_tokens, reference_gaps)):
        if not gap >= margin:  # NaN counts as a close call
            first_close = i
            break
        clear += 1
        if i < len(tandem_tokens) and tandem_tokens[i] == token:
            agreeing += 1
        else:
            first_mismatch = i
            break
    same_prefix = 0
    for a, b in zip(reference_tokens, tandem_tokens):
        if a != b:
            break
        same_prefix += 1
    return {"clear": clear, "agreeing": agreeing, "total": len(reference_tokens),
            "first_close": first_close, "first_mismatch": first_mismatch,
            "same_prefix": same_prefix, "ok": agreeing == clear}


def per_step_rule(reference_argmax, reference_gaps, tandem_tokens, margin):
    """Tandem's tokens judged step by step on Tandem's own context.

    The reference computed its logits on the prompt followed by Tandem's
    tokens (teacher forcing), so every step shares its context with Tandem's
    and is asserted on its own when the reference's margin there is clear.
    """
    if not (len(reference_argmax) == len(reference_gaps) == len(tandem_tokens)):
        raise ValueError("one reference argmax and gap per Tandem token")
    clear = agreeing = 0
    mismatches = []
    for i, (best, gap, token) in enumerate(zip(reference_argmax, reference_gaps, tandem_tokens)):
        if not gap >= margin:
            continue
        clear += 1
        if best == token:
            agreeing += 1
        else:
            mismatches.append({"step": i, "tandem": token, "reference": best, "gap": gap})
    return {"clear": clear, "agreeing": agreeing, "total": len(tandem_tokens),
            "mismatches": mismatches}


def top_values_error(tandem_sorted, reference_sorted, k):
    """Largest |difference| of the k largest log-probabilities, each side sorted."""
    k = min(k, len(tandem_sorted), len(reference_sorted))
    if k == 0:
        return None
    return max(abs(a - b) for a, b in zip(tandem_sorted[:k], reference_sorted[:k]))


# (key, label, unit, higher_is_better) of the figures compared.
FIGURES = [
    ("prefill_tokens_per_s", "prefill tok/s ({prompt}-token prompt, batch 1)", "tok/s", True),
    ("decode_ms_per_token", "decode ms/token (batch 1, after {prompt} tokens)", "ms", False),
    ("batch_decode_tokens_per_s",
     "decode tok/s (batch {batch}, after {batch_prompt}-token prompts)", "tok/s", True),
]


def ratio_rows(tandem, torch_figures, workload):
    """One row per figure and PyTorch variant: label, Tandem, PyTorch, Tandem / PyTorch.

    `tandem` maps figure keys to numbers (or None); `torch_figures` maps each
    figure key to {variant: number or None}, variants such as "eager" and
    "CUDA graphs". A ratio is None when either side is missing.
    """
    rows = []
    for key, label, unit, higher_is_better in FIGURES:
        text = label.format(**workload)
        variants = torch_figures.get(key) or {}
        for variant, value in variants.items():
            t = tandem.get(key)
            ratio = t / value if t is not None and value else None
            rows.append({"figure": key, "label": f"{text}, PyTorch {variant}", "unit": unit,
                         "higher_is_better": higher_is_better, "tandem": t, "torch": value,
                         "ratio": ratio})
    return rows


def _number(value, unit):
    if value is None:
        return "-"
    return f"{value:,.2f}" if unit == "ms" else f"{value:,.1f}"


def _short(value):
    return "-" if value is None else f"{value:.3g}"


def format_table(rows):
    """The rows as an aligned text table, with a line on how to read the ratios."""
    header = ("figure", "Tandem", "PyTorch", "Tandem / PyTorch")
    body = [(r["label"], _number(r["tandem"], r["unit"]), _number(r["torch"], r["unit"]),
             "-" if r["ratio"] is None else f"{r['ratio']:.2f}") for r in rows]
    widths = [max(len(line[i]) for line in [header] + body) for i in range(4)]
    lines = ["  ".join([header[0].ljust(widths[0])] + [header[i].rjust(widths[i])
                                                      for i in (1, 2, 3)])]
    for line in body:
        lines.append("  ".join([line[0].ljust(widths[0])] + [line[i].rjust(widths[i])
                                                            for i in (1, 2, 3)]))
    lines.append("(tok/s: a ratio above 1 means Tandem is faster; ms/token: a ratio above 1 "
                 "means Tandem is slower)")
    return "\n".join(lines)


def exactness_summary(per_prompt):
    keys = ("clear", "agreeing", "total")
    rule = {k: sum(p["margin_rule"][k] for p in per_prompt) for k in keys}
    steps = {k: sum(p["per_step"][k] for p in per_prompt if p.get("per_step")) for k in keys}
    errors = [p["last_position_top_error"] for p in per_prompt
              if p.get("last_position_top_error") is not None]
    chosen = [p["chosen_logprob_max_error"] for p in per_prompt
              if p.get("chosen_logprob_max_error") is not None]
    return {"margin_rule": rule, "per_step": steps,
            "ok": all(p["margin_rule"]["ok"] for p in per_prompt),
            "last_position_top_error_max": max(errors) if errors else None,
            "chosen_logprob_error_max": max(chosen) if chosen else None}


# ---- Tandem's agent ---------------------------------------------------------------------


def http_json(url, body=None, timeout=600):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as error:
        raise CompareError(f"{url} answered {error.code}: {error.read().decode()[:500]}")
    except urllib.error.URLError as error:
        raise CompareError(f"{url}: {error.reason}")


def cmd_fetch_tandem(args):
    base = args.url.rstrip("/")
    lengths = parse_lengths(args.lengths)
    prompts = fixed_prompts(args.seed, lengths, text_vocab_size(args.model))
    served = http_json(base + "/v1/models")["data"][0]["id"]
    health = http_json(base + "/health")
    out = {"url": base, "served_model": served, "model": os.path.abspath(args.model),
           "device": health.get("device"), "device_description": health.get("device_description"),
           "seed": args.seed, "lengths": lengths, "steps": args.steps, "prompts": []}
    for prompt in prompts:
        body = {"model": served, "prompt": prompt, "max_tokens": args.steps, "temperature": 0,
                "ignore_eos": True, "return_token_ids": True, "logprobs": TOP_LOGPROBS}
        choice = tandem_choice(http_json(base + "/v1/completions", body), args.steps)
        out["prompts"].append({"prompt": prompt, **choice})
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(out, f)
    print(f"Tandem ({out['device_description'] or out['device']}): greedy tokens of "
          f"{len(prompts)} prompts ({args.lengths} tokens, {args.steps} each) in {args.out}")


# ---- PyTorch ----------------------------------------------------------------------------


def _version_tuple(text):
    parts = []
    for piece in text.split(".")[:2]:
        digits = "".join(c for c in piece if c.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def load_model(model_dir, device, dtype_name):
    import torch
    import transformers

    dtype = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[dtype_name]
    # transformers 4.56 renamed torch_dtype to dtype.
    dtype_key = "dtype" if _version_tuple(transformers.__version__) >= (4, 56) else "torch_dtype"
    kwargs = {dtype_key: dtype, "attn_implementation": "sdpa"}
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, device_map=device,
                                                                  **kwargs)
    except Exception as error:  # noqa: BLE001 - reported, then the plain way is tried
        # device_map needs accelerate in transformers 4.x: load on the host, then move.
        print(f"torch_compare: loading with device_map={device} failed ({error}); loading on "
              "the host and moving the model", file=sys.stderr)
        model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, **kwargs).to(device)
    model.eval()
    if model.dtype != dtype:
        model.to(dtype)
    # What generate() would use; the measurements below build the same cache.
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.cache_implementation = "static"
    return model, dtype


def static_cache(model, batch, max_len, device, dtype):
    try:
        from transformers import StaticCache
    except ImportError:
        try:
            from transformers.cache_utils import StaticCache
        except ImportError:
            import transformers
            raise CompareError(f"transformers {transformers.__version__} has no StaticCache "
                               "(neither transformers.StaticCache nor "
                               "transformers.cache_utils.StaticCache)")
    # transformers 5 takes (config, max_cache_len) and sizes the rest on first
    # use, accepting the older keywords; 4.x wants them.
    attempts = [dict(config=model.config, max_cache_len=max_len, max_batch_size=batch,
                     device=device, dtype=dtype),
                dict(config=model.config, max_cache_len=max_len)]
    errors = []
    for kwargs in attempts:
        try:
            return StaticCache(**kwargs)
        except TypeError as error:
            errors.append(str(error))
    import transformers
    raise CompareError(f"transformers {transformers.__version__}: StaticCache accepts neither "
                       f"(config, max_cache_len, max_batch_size, device, dtype) nor (config, "
                       f"max_cache_len): {'; '.join(errors)}")


class Runner:
    """Forward passes of one loaded model with the keywords this transformers takes."""

    def __init__(self, model, device):
        import inspect
        self.model = model
        self.device = device
        params = inspect.signature(model.forward).parameters
        if "logits_to_keep" in params:
            self.keep_key = "logits_to_keep"
        elif "num_logits_to_keep" in params:
            self.keep_key = "num_logits_to_keep"
        else:
            self.keep_key = None
            print("torch_compare: this transformers computes logits for every position "
                  "(no logits_to_keep)", file=sys.stderr)

    def forward(self, ids, cache, positions, keep=1):
        kwargs = {"input_ids": ids, "use_cache": cache is not None}
        if cache is not None:
            kwargs["past_key_values"] = cache
            kwargs["cache_position"] = positions
            # Explicit positions too: a transformers that derives them from the
            # cache's filled length still rotates by the right angle.
            kwargs["position_ids"] = positions.unsqueeze(0).expand(ids.shape[0], -1)
        if self.keep_key is not None:
            kwargs[self.keep_key] = keep
        logits = self.model(**kwargs).logits
        return logits[:, -keep:, :]


def best_seconds(fn, warmup, repeats, setup=None):
    """Best wall time of fn over repeats, each after setup() (untimed)."""
    import torch
    for _ in range(warmup):
        if setup:
            setup()
        fn()
    torch.cuda.synchronize()
    best = math.inf
    for _ in range(repeats):
        if setup:
            setup()
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best


def measure(runner, vocab, prompt_tokens, decode_tokens, batch, args, seed):
    """Prefill seconds (batch 1 only) and decode seconds per step, eager and with CUDA graphs."""
    import torch

    device, dtype = runner.device, runner.model.dtype
    gen = torch.Generator().manual_seed(seed)
    prompts = torch.randint(0, vocab, (batch, prompt_tokens), generator=gen).to(device)
    cache = static_cache(runner.model, batch, prompt_tokens + decode_tokens, device, dtype)
    prompt_positions = torch.arange(prompt_tokens, device=device)
    result = {"prompt_tokens": prompt_tokens, "decode_tokens": decode_tokens, "batch": batch}

    # Every timed pass starts from an empty cache holding nothing but what it
    # needs (decode: the prompt), whether or not this transformers honours
    # cache_position or counts the cache's filled positions instead.
    def prefill():
        return runner.forward(prompts, cache, prompt_positions)

    def prefilled():
        cache.reset()
        prefill()

    if batch == 1:
        result["prefill_s"] = best_seconds(prefill, args.warmup, args.repeats, setup=cache.reset)
    cache.reset()
    logits = prefill()
    first = logits[:, -1, :].argmax(-1, keepdim=True)
    steps = [torch.tensor([prompt_tokens + i], device=device) for i in range(decode_tokens)]

    def decode_eager():
        ids = first
        for position in steps:
            ids = runner.forward(ids, cache, position)[:, -1, :].argmax(-1, keepdim=True)
        return ids

    result["decode_eager_step_s"] = best_seconds(decode_eager, args.warmup, args.repeats,
                                                 setup=prefilled) / decode_tokens
    result["decode_graphs_step_s"] = None
    result["cuda_graphs"] = "off"
    if args.cuda_graphs != "off":
        try:
            prefilled()
            replay = capture_decode_step(runner, cache, first, prompt_tokens)
        except Exception as error:  # noqa: BLE001 - transformers versions fail in their own ways
            reason = f"{type(error).__name__}: {error}"[:300]
            result["cuda_graphs"] = f"not captured ({reason})"
            print(f"torch_compare: batch-{batch} decode step not captured as a CUDA graph "
                  f"({reason}); eager figures only", file=sys.stderr)
            torch.cuda.synchronize()
        else:
            result["cuda_graphs"] = "captured"
            result["decode_graphs_step_s"] = best_seconds(
                lambda: replay(decode_tokens), args.warmup, args.repeats,
                setup=prefilled) / decode_tokens
            # The graph's tokens must be the eager loop's: same kernels, same inputs.
            prefilled()
            eager_last = decode_eager()
            prefilled()
            graph_last = replay(decode_tokens)
            result["graphs_match_eager"] = bool(torch.equal(eager_last, graph_last))
            if not result["graphs_match_eager"]:
                print(f"torch_compare: batch-{batch} decode replayed as a CUDA graph ends on "
                      "other tokens than eager decode", file=sys.stderr)
    return result


def gemm_seconds(m, k, n, device, dtype, warmup, repeats, calls=20):
    """PyTorch's seconds per y = x · w^T (m x k by n x k), best of `repeats`
    batches of `calls` back-to-back launches timed by CUDA events."""
    import torch

    gen = torch.Generator(device=device).manual_seed(m * 1_000_003 + k * 1_009 + n)
    x = torch.randn(m, k, device=device, dtype=dtype, generator=gen)
    w = torch.randn(n, k, device=device, dtype=dtype, generator=gen)
    for _ in range(warmup):
        torch.nn.functional.linear(x, w)
    torch.cuda.synchronize()
    best = math.inf
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            torch.nn.functional.linear(x, w)
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3 / calls)
    del x, w
    return best


def capture_decode_step(runner, cache, first, prompt_tokens):
    """One decode step (forward, argmax, next position) recorded as a CUDA graph.

    The step reads its token and position from static buffers and advances
    them, so replaying it n times decodes n tokens greedily. Returns
    replay(n), which restarts at the first decode position.
    """
    import torch

    ids = first.clone()
    position = torch.tensor([prompt_tokens], device=runner.device)

    def step():
        logits = runner.forward(ids, cache, position)
        ids.copy_(logits[:, -1, :].argmax(-1, keepdim=True))
        position.add_(1)

    def reset():
        ids.copy_(first)
        position.fill_(prompt_tokens)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            reset()
            step()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    reset()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()

    def replay(n):
        reset()
        for _ in range(n):
            graph.replay()
        return ids.clone()

    return replay


def reference_tokens(runner, prompts, steps):
    """Greedy decoding of each prompt: tokens, top-1 minus top-2 logit per step, and
    the sorted top log-probabilities at the last prompt position."""
    import torch

    device = runner.device
    longest = max(len(p) for p in prompts) + steps
    cache = static_cache(runner.model, 1, longest, device, runner.model.dtype)
    out = []
    for prompt in prompts:
        cache.reset()
        ids = torch.tensor([prompt], device=device)
        logits = runner.forward(ids, cache, torch.arange(len(prompt), device=device))[0, -1]
        logits = logits.float()
        top_lp = torch.log_softmax(logits, -1).topk(TOP_LOGPROBS).values.tolist()
        tokens, gaps = [], []
        for i in range(steps):
            top2 = logits.topk(2)
            tokens.append(int(top2.indices[0]))
            gaps.append(float(top2.values[0] - top2.values[1]))
            if i + 1 == steps:
                break
            next_ids = torch.tensor([[tokens[-1]]], device=device)
            position = torch.tensor([len(prompt) + i], device=device)
            logits = runner.forward(next_ids, cache, position)[0, -1].float()
        out.append({"tokens": tokens, "gaps": gaps, "last_position_top_logprobs": top_lp})
    del cache
    torch.cuda.empty_cache()
    return out


def reference_on_tandem_path(runner, prompt, tandem_tokens):
    """Logits at every step on the prompt followed by Tandem's tokens: per step the
    argmax, top-1 minus top-2 gap, and the log-probability of Tandem's token."""
    import torch

    steps = len(tandem_tokens)
    ids = torch.tensor([prompt + tandem_tokens[:-1]], device=runner.device)
    logits = runner.forward(ids, None, None, keep=steps)[0].float()
    top2 = logits.topk(2, dim=-1)
    logprobs = torch.log_softmax(logits, -1)
    chosen = logprobs[torch.arange(steps, device=runner.device),
                      torch.tensor(tandem_tokens, device=runner.device)]
    return {"argmax": top2.indices[:, 0].tolist(),
            "gaps": (top2.values[:, 0] - top2.values[:, 1]).tolist(),
            "chosen_logprobs": chosen.tolist()}


def workloads(args, model_dir):
    config = load_json(os.path.join(model_dir, "config.json"), "model config")
    context = int(config.get("max_position_embeddings", DEFAULT_PROMPT_TOKENS + 64))
    single = batched = None
    if args.tandem_bench:
        single = read_tandem_bench(args.tandem_bench, expect_batch_one=True)
    if args.tandem_bench_batch:
        batched = read_tandem_bench(args.tandem_bench_batch, expect_batch_one=False)
    decode = single["decode_tokens"] if single else DEFAULT_DECODE_TOKENS
    prompt = single["prompt_tokens"] if single else min(DEFAULT_PROMPT_TOKENS, context - decode)
    if batched:
        batch, batch_prompt, batch_decode = (batched["batch"], batched["prompt_tokens"],
                                             batched["decode_tokens"])
    else:
        batch, batch_prompt, batch_decode = (DEFAULT_BATCH, DEFAULT_BATCH_PROMPT_TOKENS,
                                             DEFAULT_DECODE_TOKENS)
    return single, batched, {"prompt": prompt, "decode": decode, "batch": batch,
                             "batch_prompt": batch_prompt, "batch_decode": batch_decode}


def cmd_compare(args):
    try:
        import torch
        import transformers
    except ImportError as error:
        raise CompareError(f"compare needs torch and transformers: {error}")
    if not args.device.startswith("cuda"):
        raise CompareError(f"--device must be cuda or cuda:N (the timings synchronize the GPU), "
                           f"got {args.device}")
    if not torch.cuda.is_available():
        raise CompareError(f"--device {args.device}: torch {torch.__version__} sees no CUDA "
                           "device")
    # torch.cuda.synchronize() waits for the current device: make it this one.
    # "cuda" alone names no index: the current device, 0 unless set otherwise.
    device = torch.device(args.device)
    torch.cuda.set_device(device.index if device.index is not None else torch.cuda.current_device())
    single, batched, work = workloads(args, args.model)
    gemm_shapes = (profiled_matmuls(load_json(args.tandem_bench_gemm, "tandem-bench JSON"),
                                    args.tandem_bench_gemm) if args.tandem_bench_gemm else [])
    tokens_file = read_tandem_tokens(args.tandem_tokens) if args.tandem_tokens else None
    vocab = text_vocab_size(args.model)

    start = time.perf_counter()
    model, _ = load_model(args.model, args.device, args.dtype)
    print(f"PyTorch {torch.__version__}, transformers {transformers.__version__}, "
          f"{torch.cuda.get_device_name()}: loaded {args.model} ({args.dtype}, sdpa, static KV "
          f"cache) in {time.perf_counter() - start:.1f} s")
    runner = Runner(model, args.device)
    if tokens_file:
        check_token_ids(tokens_file, int(model.config.vocab_size))
    with torch.inference_mode():
        # Each measurement's cache and graphs are gone once it returns.
        one = measure(runner, vocab, work["prompt"], work["decode"], 1, args, seed=42)
        torch.cuda.empty_cache()
        many = measure(runner, vocab, work["batch_prompt"], work["batch_decode"], work["batch"],
                       args, seed=43)
        torch.cuda.empty_cache()

        if tokens_file:
            prompts = [p["prompt"] for p in tokens_file["prompts"]]
            steps = int(tokens_file["steps"])
        else:
            prompts = fixed_prompts(args.seed, parse_lengths(args.lengths), vocab)
            steps = args.steps
        references = reference_tokens(runner, prompts, steps)
        per_prompt = []
        for index, (prompt, ref) in enumerate(zip(prompts, references)):
            entry = {"prompt_tokens": len(prompt), "reference_tokens": ref["tokens"],
                     "reference_gaps": ref["gaps"],
                     "reference_last_position_top_logprobs": ref["last_position_top_logprobs"]}
            if tokens_file:
                tandem = tokens_file["prompts"][index]
                entry["tandem_tokens"] = tandem["token_ids"]
                entry["margin_rule"] = margin_rule(ref["tokens"], ref["gaps"],
                                                   tandem["token_ids"], args.margin)
                path = reference_on_tandem_path(runner, prompt, tandem["token_ids"])
                entry["per_step"] = per_step_rule(path["argmax"], path["gaps"],
                                                  tandem["token_ids"], args.margin)
                entry["last_position_top_error"] = top_values_error(
                    tandem["top_logprobs"][0], ref["last_position_top_logprobs"], COMPARED_TOP)
                entry["chosen_logprob_max_error"] = max(
                    abs(a - b) for a, b in zip(tandem["token_logprobs"], path["chosen_logprobs"]))
            per_prompt.append(entry)

    tandem = {}
    if single:
        tandem["prefill_tokens_per_s"] = single["prefill_tokens_per_s"]
        tandem["decode_ms_per_token"] = single["decode_ms_per_step"]
    if batched:
        tandem["batch_decode_tokens_per_s"] = batched["decode_tokens_per_s"]

    def ms(step_s):
        return None if step_s is None else step_s * 1e3

    def tps(step_s, batch):
        return None if step_s is None else batch / step_s

    torch_figures = {
        "prefill_tokens_per_s": {"eager": work["prompt"] / one["prefill_s"]},
        "decode_ms_per_token": {"eager": ms(one["decode_eager_step_s"])},
        "batch_decode_tokens_per_s": {"eager": tps(many["decode_eager_step_s"], work["batch"])},
    }
    if one["decode_graphs_step_s"] is not None:
        torch_figures["decode_ms_per_token"]["CUDA graphs"] = ms(one["decode_graphs_step_s"])
    if many["decode_graphs_step_s"] is not None:
        torch_figures["batch_decode_tokens_per_s"]["CUDA graphs"] = tps(
            many["decode_graphs_step_s"], work["batch"])
    rows = ratio_rows(tandem, torch_figures, work)
    print()
    print(format_table(rows))
    tandem_side = ("" if not single else
                   f"Tandem on {single.get('device_description') or single.get('device')}, "
                   f"decode steps recorded: {single.get('decode_steps_recorded')}; ")
    print(f"({tandem_side}PyTorch decode as a CUDA graph: batch 1 {one['cuda_graphs']}, batch "
          f"{work['batch']} {many['cuda_graphs']}; {work['decode']} decode steps; PyTorch best "
          f"of {args.repeats} after {args.warmup} warm-up)")

    gemms = []
    if gemm_shapes:
        dtype = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[args.dtype]
        with torch.inference_mode():
            torch_s = [gemm_seconds(g["m"], g["k"], g["n"], args.device, dtype, args.warmup,
                                    args.repeats) for g in gemm_shapes]
        gemms = gemm_rows(gemm_shapes, torch_s)
        print()
        print(f"matmuls of one prefill ({args.tandem_bench_gemm}), PyTorch {args.dtype}:")
        print(format_gemm_table(gemms))

    summary = exactness_summary(per_prompt) if tokens_file else None
    print()
    if summary:
        rule, steps_rule = summary["margin_rule"], summary["per_step"]
        print(f"exactness, margin {args.margin} on the reference's top-1 minus top-2 logit: "
              f"{rule['clear']} positions with a clear margin, {rule['agreeing']} agreeing, of "
              f"{rule['total']} ({len(prompts)} prompts, {steps} greedy tokens each)")
        print(f"  each step on Tandem's own tokens: {steps_rule['clear']} with a clear margin, "
              f"{steps_rule['agreeing']} agreeing, of {steps_rule['total']}")
        for entry in per_prompt:
            r = entry["margin_rule"]
            where = ("" if r["first_mismatch"] is None else
                     f"; DISAGREES at step {r['first_mismatch']}: Tandem "
                     f"{entry['tandem_tokens'][r['first_mismatch']]}, PyTorch "
                     f"{entry['reference_tokens'][r['first_mismatch']]}")
            close = ("" if r["first_close"] is None else
                     f", first close call at step {r['first_close']}")
            print(f"  prompt of {entry['prompt_tokens']} tokens: {r['agreeing']}/{r['clear']} "
                  f"clear positions agree{close}, identical for {r['same_prefix']}/{r['total']}"
                  f"{where}; last position top-{COMPARED_TOP} log-prob error "
                  f"{_short(entry['last_position_top_error'])}")
        print(f"  largest |log-prob difference|: last prompt position (top {COMPARED_TOP}) "
              f"{_short(summary['last_position_top_error_max'])}, Tandem's chosen tokens "
              f"{_short(summary['chosen_logprob_error_max'])}")
    else:
        print("exactness: no --tandem-tokens file; the reference's greedy tokens are in --out "
              "only")

    if args.out:
        out = {"model": os.path.abspath(args.model), "device": args.device, "dtype": args.dtype,
               "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
               "transformers": transformers.__version__, "attn_implementation": "sdpa",
               "cache": "StaticCache", "repeats": args.repeats, "warmup": args.warmup,
               "margin": args.margin, "workload": work, "tandem_bench": single,
               "tandem_bench_batch": batched,
               "tandem_tokens_source": tokens_file and {k: tokens_file.get(k) for k in (
                   "url", "device", "device_description", "seed", "lengths", "steps")},
               "torch_batch1": one, "torch_batch": many, "figures": rows, "gemms": gemms,
               "exactness": summary, "per_prompt": per_prompt}
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=2)
        print(f"wrote {args.out}")
    return 0 if summary is None or summary["ok"] else 1


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    f = sub.add_parser("fetch-tandem", help="Tandem's greedy tokens from a running agent")
    f.add_argument("--url", required=True, help="the agent, e.g. http://127.0.0.1:8000")
    f.add_argument("--model", required=True, help="the model directory the agent serves")
    f.add_argument("--out", required=True)
    f.add_argument("--lengths", default=DEFAULT_LENGTHS, help="prompt lengths in tokens")
    f.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="greedy tokens per prompt")
    f.add_argument("--seed", type=int, default=DEFAULT_SEED)
    c = sub.add_parser("compare", help="PyTorch's figures and tokens next to Tandem's")
    c.add_argument("--model", required=True, help="Hugging Face model directory")
    c.add_argument("--device", default="cuda")
    c.add_argument("--dtype", default="bf16", choices=["bf16", "f16", "f32"])
    c.add_argument("--tandem-bench", help="tandem-bench engine --json of the batch-1 run")
    c.add_argument("--tandem-bench-batch", help="tandem-bench engine --json of the batched run")
    c.add_argument("--tandem-tokens", help="the fetch-tandem output for this model")
    c.add_argument("--tandem-bench-gemm",
                   help="tandem-bench engine --profile-ops --json run whose prefill matmuls "
                        "are compared shape by shape with torch.nn.functional.linear")
    c.add_argument("--margin", type=float, default=DEFAULT_MARGIN)
    c.add_argument("--repeats", type=int, default=3)
    c.add_argument("--warmup", type=int, default=1)
    c.add_argument("--cuda-graphs", choices=["auto", "off"], default="auto",
                   help="also time decode steps replayed as CUDA graphs (auto: when capture works)")
    c.add_argument("--lengths", default=DEFAULT_LENGTHS,
                   help="prompt lengths without --tandem-tokens")
    c.add_argument("--steps", type=int, default=DEFAULT_STEPS,
                   help="greedy tokens without --tandem-tokens")
    c.add_argument("--seed", type=int, default=DEFAULT_SEED)
    c.add_argument("--out", help="JSON with every figure, token and setting")
    args = parser.parse_args(argv)
    for name in ("steps", "repeats"):
        if getattr(args, name, 1) < 1:
            parser.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    if getattr(args, "warmup", 0) < 0:
        parser.error(f"--warmup must be at least 0, got {args.warmup}")
    if getattr(args, "margin", 0.0) < 0:
        parser.error(f"--margin must be at least 0, got {args.margin}")
    try:
        if args.command == "fetch-tandem":
            cmd_fetch_tandem(args)
            return 0
        return cmd_compare(args)
    except CompareError as error:
        print(f"torch_compare: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
