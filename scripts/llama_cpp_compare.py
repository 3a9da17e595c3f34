#!/usr/bin/env python3
"""The figures and checks of scripts/bench-vs-llama-cpp.sh.

  llama_cpp_compare.py round --dtype D --round I --llama L.json --tandem T.json \
      --tandem-short S.json --out R.json
      one round's figures from llama-bench's and tandem-bench engine's JSON
  llama_cpp_compare.py summary --rounds R1.json ... --out summary.json
      per-round table, medians of each figure and of the per-round ratios
  llama_cpp_compare.py correctness --model DIR --tandem-url U --llama-url U \
      --dtype D --out C.json
      greedy tokens of both servers on the same token-id prompts, and both
      engines' last-position log-probabilities against a float64 reference
      forward pass of the model
"""

import argparse
import json
import math
import os
import statistics
import struct
import sys
import urllib.error
import urllib.request

import numpy as np

# (key, label) of the figures compared; higher is better for all of them.
FIGURES = [
    ("prefill_tps", "prefill tok/s (512-token prompt)"),
    ("decode_tps", "decode tok/s (128 tokens, empty context)"),
    ("decode_ctx_tps", "decode tok/s (128 tokens after 512)"),
]


# Bytes per cached K or V element, by the dtype names both engines report.
KV_ELEMENT_BYTES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "fp8": 1.0, "q8_0": 34 / 32,
                    "q4_0": 18 / 32}


def load(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def cmd_round(args):
    llama = load(args.llama)
    fig = {}
    for row in llama:
        depth = row.get("n_depth", 0)
        if row["n_prompt"] == 512 and row["n_gen"] == 0 and depth == 0:
            fig["prefill_tps"] = row["avg_ts"]
        elif row["n_prompt"] == 0 and row["n_gen"] == 128 and depth == 0:
            fig["decode_tps"] = row["avg_ts"]
        elif row["n_prompt"] == 0 and row["n_gen"] == 128 and depth == 512:
            fig["decode_ctx_tps"] = row["avg_ts"]
    tandem = load(args.tandem)
    short = load(args.tandem_short)
    # Decode reads the weights and, per step, the KV cache up to the position:
    # both engines run the same positions, so llama.cpp's KV bytes are
    # Tandem's scaled by the two caches' element sizes.
    llama_kv = (KV_ELEMENT_BYTES[llama[0]["type_k"]] + KV_ELEMENT_BYTES[llama[0]["type_v"]]) / (
        2 * KV_ELEMENT_BYTES[tandem["kv_dtype"]])

    def step_bytes(run, kv_scale):
        return run["decode_weight_bytes_per_step"] + kv_scale * run["decode_kv_bytes_per_step"]

    def llama_over_read(tps, run, kv_scale):
        return tps * step_bytes(run, kv_scale) / 1e9 / tandem["read_gbps"]

    out = {
        "dtype": args.dtype,
        "round": args.round,
        "llama": fig,
        "llama_build": {"commit": llama[0].get("build_commit"), "cpu": llama[0].get("cpu_info"),
                        "type_k": llama[0].get("type_k"), "type_v": llama[0].get("type_v")},
        "tandem": {
            "prefill_tps": tandem["prefill_tokens_per_s"],
            "decode_tps": short["decode_tokens_per_s"],
            "decode_ctx_tps": tandem["decode_tokens_per_s"],
        },
        "tandem_read_gbps": tandem["read_gbps"],
        "tandem_decode_stream_gbps": short["decode_stream_gbps"],
        "tandem_decode_ctx_stream_gbps": tandem["decode_stream_gbps"],
        "tandem_decode_over_read": short["decode_stream_over_read"],
        "tandem_decode_ctx_over_read": tandem["decode_stream_over_read"],
        "tandem_decode_total_over_read": short["decode_total_stream_over_read"],
        "tandem_decode_ctx_total_over_read": tandem["decode_total_stream_over_read"],
        # Compute ceilings measured in the same run, and each engine's
        # prefill in matmul flops per second of prefill (the same model, so
        # the same flops per token), and decode in weight bytes per second.
        "fma_peak_gflops": tandem["fma_peak_gflops"],
        "bf16_dot_peak_gflops": tandem["bf16_dot_peak_gflops"],
        "tandem_prefill_gflops": tandem["prefill_matmul_gflops"],
        "llama_prefill_gflops": fig.get("prefill_tps", 0.0)
        * tandem["prefill_matmul_flops_per_token"] / 1e9,
        "llama_decode_over_read": llama_over_read(fig.get("decode_tps", 0.0), short, 0.0),
        "llama_decode_ctx_over_read": llama_over_read(fig.get("decode_ctx_tps", 0.0), tandem, 0.0),
        "llama_decode_total_over_read": llama_over_read(fig.get("decode_tps", 0.0), short,
                                                        llama_kv),
        "llama_decode_ctx_total_over_read": llama_over_read(fig.get("decode_ctx_tps", 0.0),
                                                            tandem, llama_kv),
        "tandem_weight_dtype": tandem["weight_dtype"],
        "tandem_kv_dtype": tandem["kv_dtype"],
        "tandem_isa": tandem["isa"],
    }
    missing = [k for k, _ in FIGURES if k not in fig]
    if missing:
        sys.exit(f"llama_cpp_compare: llama-bench output lacks {missing}: {args.llama}")
    out["ratio"] = {k: out["tandem"][k] / fig[k] for k, _ in FIGURES}
    print(f"  round {args.round} {args.dtype}: " + "; ".join(
        f"{k} tandem {out['tandem'][k]:.1f} llama.cpp {fig[k]:.1f} ({out['ratio'][k]:.2f}x)"
        for k, _ in FIGURES))
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=2)


def cmd_summary(args):
    rounds = [load(p) for p in args.rounds]
    by_dtype = {}
    for r in rounds:
        by_dtype.setdefault(r["dtype"], []).append(r)
    summary = {"dtypes": {}}
    lines = []
    lines.append("| dtype | figure | Tandem (median) | llama.cpp (median) | Tandem / llama.cpp "
                 "(median of per-round ratios) | per-round ratios |")
    lines.append("| --- | --- | ---: | ---: | ---: | --- |")
    for dtype, rs in by_dtype.items():
        entry = {"rounds": len(rs), "figures": {}}
        for key, label in FIGURES:
            t = statistics.median(r["tandem"][key] for r in rs)
            l = statistics.median(r["llama"][key] for r in rs)
            ratios = [r["ratio"][key] for r in rs]
            ratio = statistics.median(ratios)
            entry["figures"][key] = {"tandem": t, "llama_cpp": l, "ratio": ratio,
                                     "round_ratios": ratios}
            lines.append(f"| {dtype} | {label} | {t:,.1f} | {l:,.1f} | {ratio:.2f}x | "
                         + " ".join(f"{x:.2f}" for x in ratios) + " |")
        for key in ("tandem_decode_over_read", "tandem_decode_ctx_over_read",
                    "tandem_decode_total_over_read", "tandem_decode_ctx_total_over_read",
                    "tandem_read_gbps", "llama_decode_over_read", "llama_decode_ctx_over_read",
                    "llama_decode_total_over_read", "llama_decode_ctx_total_over_read",
                    "fma_peak_gflops", "bf16_dot_peak_gflops", "tandem_prefill_gflops",
                    "llama_prefill_gflops"):
            entry[key] = statistics.median(r[key] for r in rs)
        entry["llama_cpp_kv"] = f"{rs[0]['llama_build']['type_k']}/{rs[0]['llama_build']['type_v']}"
        entry["tandem_kv"] = rs[0]["tandem_kv_dtype"]
        summary["dtypes"][dtype] = entry
    summary["llama_cpp_commit"] = rounds[0]["llama_build"]["commit"] if rounds else None
    summary["cpu"] = rounds[0]["llama_build"]["cpu"] if rounds else None
    print("\n".join(lines))
    print()
    for dtype, entry in summary["dtypes"].items():
        print(f"{dtype}: decode weight stream / host memory read (the memory-read ceiling, "
              f"read {entry['tandem_read_gbps']:.1f} GB/s): Tandem "
              f"{entry['tandem_decode_over_read']:.2f} (empty context), "
              f"{entry['tandem_decode_ctx_over_read']:.2f} (after 512); llama.cpp "
              f"{entry['llama_decode_over_read']:.2f}, {entry['llama_decode_ctx_over_read']:.2f}; "
              f"KV: Tandem {entry['tandem_kv']}, llama.cpp {entry['llama_cpp_kv']}")
        print(f"{dtype}: decode weights + KV stream / host memory read (each engine's own KV "
              f"bytes): Tandem {entry['tandem_decode_total_over_read']:.2f} (empty context), "
              f"{entry['tandem_decode_ctx_total_over_read']:.2f} (after 512); llama.cpp "
              f"{entry['llama_decode_total_over_read']:.2f}, "
              f"{entry['llama_decode_ctx_total_over_read']:.2f}")
        fma, dot = entry["fma_peak_gflops"], entry["bf16_dot_peak_gflops"]
        ceilings = lambda g: f"{g / fma:.2f} of fp32 FMA peak" + (
            f", {g / dot:.2f} of bf16 dot peak" if dot > 0 else "")
        print(f"{dtype}: prefill matmul flops / prefill time (compute peaks {fma:,.0f} GFLOP/s "
              f"fp32 FMA, {dot:,.0f} bf16 dot): Tandem {entry['tandem_prefill_gflops']:,.1f} "
              f"GFLOP/s = {ceilings(entry['tandem_prefill_gflops'])}; llama.cpp "
              f"{entry['llama_prefill_gflops']:,.1f} GFLOP/s = "
              f"{ceilings(entry['llama_prefill_gflops'])}")
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2)


# ---- float64 reference forward pass -------------------------------------------------


def f8e4m3_values():
    """The 256 values of the float8 e4m3fn format, from its definition: sign,
    4 exponent bits (bias 7, subnormals at 0), 3 mantissa bits, NaN at
    S.1111.111, no infinities."""
    values = np.empty(256)
    for b in range(256):
        sign, exponent, mantissa = b >> 7, (b >> 3) & 15, b & 7
        if exponent == 15 and mantissa == 7:
            value = math.nan
        elif exponent == 0:
            value = mantissa / 8 * 2.0 ** -6
        else:
            value = (1 + mantissa / 8) * 2.0 ** (exponent - 7)
        values[b] = -value if sign else value
    return values


def mxfp4_matrices(blocks, scales):
    """MXFP4 blocks [..., rows, cols / 32, 16] (U8: two FP4 E2M1 values a
    byte, the low nibble first) and scales [..., rows, cols / 32] (U8, E8M0:
    2^(s - 127)) as the float64 matrices [..., rows, cols] they hold, from
    the OCP Microscaling format's definition."""
    fp4 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    fp4 = np.concatenate([fp4, -fp4])
    b = blocks.astype(np.int64)
    values = np.stack([fp4[b & 15], fp4[b >> 4]], axis=-1).reshape(*b.shape[:-1], 32)
    values = values * np.exp2(scales.astype(np.float64) - 127)[..., None]
    return values.reshape(*values.shape[:-2], -1)


def dequantize(weights, config):
    """fp8 matrices times their scales, on the grid config.json's
    quantization_config gives (per tensor, per output channel, or blocks);
    GPT-OSS's MXFP4 experts as the [experts, in, out] matrices transformers
    holds them as."""
    for name in [n for n in weights if n.endswith("_blocks")]:
        stem = name[: -len("_blocks")]
        matrices = mxfp4_matrices(weights.pop(name), weights.pop(stem + "_scales"))
        weights[stem] = matrices.transpose(0, 2, 1)
    q = config.get("quantization_config") or {}
    block = q.get("weight_block_size")
    for group in (q.get("config_groups") or {}).values():
        group_weights = (group or {}).get("weights") or {}
        if group_weights.get("strategy") == "block":
            block = group_weights.get("block_structure")
    for name in [n for n in weights if n.endswith(".weight_scale") or
                 n.endswith(".weight_scale_inv")]:
        matrix = name.rsplit(".", 1)[0] + ".weight"
        w, scale = weights[matrix], weights.pop(name)
        if block:
            # The config's blocks, whatever the grid's shape (one column of
            # blocks is still blocks of rows).
            rows, cols = block
            grid = np.repeat(np.repeat(scale.reshape(-(-w.shape[0] // rows), -1), rows, axis=0),
                             cols, axis=1)
            weights[matrix] = w * grid[: w.shape[0], : w.shape[1]]
        elif scale.size == 1:
            weights[matrix] = w * scale.reshape(())
        else:
            weights[matrix] = w * scale.reshape(-1, 1)
    return weights


def read_weights(model_dir):
    """All tensors of model.safetensors as float64 arrays, fp8 ones
    dequantized."""
    path = os.path.join(model_dir, "model.safetensors")
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_len))
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + header_len)
    weights = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        raw = data[begin:end]
        if info["dtype"] == "BF16":
            values = (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif info["dtype"] == "F16":
            values = raw.view(np.float16)
        elif info["dtype"] == "F32":
            values = raw.view(np.float32)
        elif info["dtype"] == "F8_E4M3":
            values = f8e4m3_values()[np.asarray(raw)]
        elif info["dtype"] == "U8":
            values = np.asarray(raw)
        else:
            sys.exit(f"llama_cpp_compare: tensor {name} has dtype {info['dtype']}")
        weights[name] = values.astype(np.float64).reshape(info["shape"])
    return dequantize(weights, load(os.path.join(model_dir, "config.json")))


def round_bf16(x):
    """float64 values rounded to bfloat16 (nearest, ties to even), as float64."""
    bits = np.atleast_1d(np.asarray(x, dtype=np.float32)).view(np.uint32).astype(np.uint64)
    bits = (bits + np.uint64(0x7FFF) + ((bits >> np.uint64(16)) & np.uint64(1))) \
        & np.uint64(0xFFFF0000)
    out = bits.astype(np.uint32).view(np.float32).astype(np.float64)
    return out if np.ndim(x) else float(out[0])


class Reference:
    """Hugging Face Llama, Gemma 3, Mixtral or Qwen3-MoE forward pass in
    float64 (no KV cache: whole sequence). A mixture layer is transformers'
    sparse MoE block: softmax over the router's logits, the
    num_experts_per_tok largest, renormalized (Mixtral; Qwen3-MoE with
    norm_topk_prob), each chosen expert's SwiGLU MLP weighted and summed.
    Gemma 3 is transformers' Gemma3ForCausalLM: the embedding times
    sqrt(hidden_size) (in the weights' dtype: a bf16 product), RMSNorm by
    (1 + w), sandwich norms, GELU (tanh), query_pre_attn_scalar, and
    sliding layers attending to the last sliding_window positions with
    their own rotary base. Phi-3 is transformers' Phi3ForCausalLM: q/k/v and
    gate/up stored as one matrix each, the first int(head_dim x
    partial_rotary_factor) dims of a head rotating, LongRoPE (the long
    factors when max_model_len exceeds original_max_position_embeddings, as
    vLLM chooses once; cos and sin times the attention factor), and
    sliding_window on every layer. Granite is transformers'
    GraniteForCausalLM: the embedding times embedding_multiplier (the
    product in the weights' dtype), scores scaled by attention_multiplier,
    each residual branch times residual_multiplier, the logits divided by
    logits_scaling. OLMo 2 is transformers' Olmo2ForCausalLM: no norm before
    attention or the MLP, their outputs normalized before each residual
    add, q and k normalized across all heads before RoPE. OLMo 3 is OLMo 2
    with sliding_window on the layers layer_types marks (else all but every
    4th), which rotate unscaled: rope_scaling (YaRN) is the full layers'
    only, as OLMo-core and vLLM compute it. Gemma's sliding layers
    likewise take no attention factor. Ministral 3 is transformers'
    Ministral3ForCausalLM: Mistral with the rotated queries of position p
    times 1 + llama_4_scaling_beta * ln(1 + floor(p /
    original_max_position_embeddings)). GLM is transformers'
    GlmForCausalLM: q/k/v biases, gate/up stored as one matrix, the first
    int(head_dim x partial_rotary_factor) dims of a head (GlmConfig's 0.5)
    rotating with cos and sin repeated pairwise and rotate_half over
    x[0::2] and x[1::2]; GLM-4 (Glm4ForCausalLM) adds post_self_attn_layernorm
    and post_mlp_layernorm on the attention's and the MLP's outputs. GLM-4.5
    is transformers' Glm4MoeForCausalLM: the first int(head_dim x
    partial_rotary_factor) dims of a head rotating as halves, q/k/v biases
    with attention_bias, per-head q/k norms with use_qk_norm, the first
    first_k_dense_replace layers dense, and DeepSeek-V3's routing: the
    router's sigmoid plus e_score_correction_bias ranks the experts within
    the topk_group best of n_group groups (a group's rank: its two best
    biased scores summed; the others' experts out of the choice, as vLLM's
    grouped_topk has them), the chosen sigmoids renormalized (sum + 1e-20)
    with norm_topk_prob and times routed_scaling_factor, the shared experts'
    SwiGLU added. Qwen2-MoE is transformers' Qwen2MoeForCausalLM: Qwen2's
    q/k/v biases, Qwen3-MoE's softmax routing and dense layers, and the
    shared expert's SwiGLU times sigmoid(shared_expert_gate x) added.
    GPT-OSS is transformers' GptOssForCausalLM: q/k/v and o_proj biases,
    a sink logit per head joining each softmax (its weight dropped), every
    other layer sliding (layer_types), YaRN; its router a linear layer with
    a bias, the softmax over its num_experts_per_tok largest logits, each
    expert x @ gate_up_proj + bias with gate and up interleaved, gate
    clamped above and up on both sides at swiglu_limit, (up + 1) * gate *
    sigmoid(1.702 gate) @ down_proj + bias. Granite MoE is transformers'
    GraniteMoeForCausalLM: Granite's scalars (the mixture's output times
    residual_multiplier) with GPT-OSS's routing without the bias
    (block_sparse_moe.router.layer), the experts stacked in
    block_sparse_moe.input_linear (gate rows, then up rows) and
    output_linear."""

    def __init__(self, model_dir, max_model_len=None):
        self.config = load(os.path.join(model_dir, "config.json"))
        self.w = read_weights(model_dir)
        c = self.config
        self.arch = c["architectures"][0]
        self.phi3 = self.arch == "Phi3ForCausalLM"
        self.granite_moe = self.arch == "GraniteMoeForCausalLM"
        self.granite = self.arch == "GraniteForCausalLM" or self.granite_moe
        self.olmo3 = self.arch == "Olmo3ForCausalLM"
        self.ministral3 = self.arch == "Ministral3ForCausalLM"
        self.olmo2 = self.arch == "Olmo2ForCausalLM" or self.olmo3
        self.glm4 = self.arch == "Glm4ForCausalLM"
        self.glm = self.arch == "GlmForCausalLM" or self.glm4
        self.glm4_moe = self.arch == "Glm4MoeForCausalLM"
        self.sigmoid = self.glm4_moe
        self.gpt_oss = self.arch == "GptOssForCausalLM"
        self.olmoe = self.arch == "OlmoeForCausalLM"
        # SmolLM3Config: no_rope_layers (1 rotates), else every 4th layer
        # (no_rope_layer_interval) does not.
        layers = c["num_hidden_layers"]
        interval = c.get("no_rope_layer_interval", 4)
        self.rotates = (c.get("no_rope_layers") or [int((i + 1) % interval != 0)
                                                     for i in range(layers)])[:layers]
        if self.arch != "SmolLM3ForCausalLM":
            self.rotates = [1] * layers
        self.gemma2 = self.arch == "Gemma2ForCausalLM"
        self.gemma = self.arch == "Gemma3ForCausalLM" or self.gemma2
        self.qk_norm = (self.arch.startswith("Qwen3") or (self.gemma and not self.gemma2)
                        or (self.glm4_moe and c.get("use_qk_norm", False)))
        self.qk_norm_whole = self.olmo2 or self.olmoe
        if self.arch == "MixtralForCausalLM":
            self.experts, self.block = c.get("num_local_experts", 8), "block_sparse_moe."
            self.names, self.normalize = ("w1", "w3", "w2"), True
        elif self.arch in ("Qwen3MoeForCausalLM", "Qwen2MoeForCausalLM", "OlmoeForCausalLM"):
            self.experts = c.get("num_experts", c.get("num_local_experts",
                                                     60 if self.arch.startswith("Qwen2")
                                                     else 64 if self.olmoe else 128))
            self.block, self.names = "mlp.", ("gate_proj", "up_proj", "down_proj")
            self.normalize = bool(c.get("norm_topk_prob", False))
        elif self.glm4_moe:
            self.experts = c.get("n_routed_experts", c.get("num_local_experts", 128))
            self.block, self.names = "mlp.", ("gate_proj", "up_proj", "down_proj")
            self.normalize = bool(c.get("norm_topk_prob", True))
        elif self.gpt_oss:
            self.experts, self.block, self.normalize = c.get("num_local_experts", 128), "mlp.", True
        elif self.granite_moe:
            self.experts, self.block = c.get("num_local_experts", 8), "block_sparse_moe."
            self.normalize = True
        else:
            self.experts = 0
        # The engine's (transformers') defaults where the config is silent.
        self.k = c.get("num_experts_per_tok", {"MixtralForCausalLM": 2, "GptOssForCausalLM": 4,
                                               "GraniteMoeForCausalLM": 2,
                                               "Qwen2MoeForCausalLM": 4}.get(self.arch, 8))
        self.heads = c["num_attention_heads"]
        self.kv_heads = c.get("num_key_value_heads", self.heads)
        self.head_dim = c.get("head_dim") or (128 if self.glm else 64 if self.gpt_oss
                                              else c["hidden_size"] // self.heads)
        self.rotary_dim = self.head_dim
        self.mscale = 1.0
        if self.glm:
            partial = c.get("partial_rotary_factor",
                            (c.get("rope_parameters") or {}).get("partial_rotary_factor", 0.5))
            self.rotary_dim = int(self.head_dim * partial)
            for i in range(c["num_hidden_layers"]):
                p = f"model.layers.{i}."
                gate, up = np.split(self.w.pop(p + "mlp.gate_up_proj.weight"), 2)
                self.w[p + "mlp.gate_proj.weight"], self.w[p + "mlp.up_proj.weight"] = gate, up
        if self.glm4_moe:
            self.rotary_dim = int(self.head_dim * c.get("partial_rotary_factor", 0.5))
        if self.phi3:
            self.rotary_dim = int(self.head_dim * c.get("partial_rotary_factor", 1.0))
            q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
            for i in range(c["num_hidden_layers"]):
                p = f"model.layers.{i}."
                qkv = self.w.pop(p + "self_attn.qkv_proj.weight")
                self.w[p + "self_attn.q_proj.weight"] = qkv[:q]
                self.w[p + "self_attn.k_proj.weight"] = qkv[q:q + kv]
                self.w[p + "self_attn.v_proj.weight"] = qkv[q + kv:]
                gate, up = np.split(self.w.pop(p + "mlp.gate_up_proj.weight"), 2)
                self.w[p + "mlp.gate_proj.weight"], self.w[p + "mlp.up_proj.weight"] = gate, up
        d = self.rotary_dim
        theta = c.get("rope_theta", 1e6 if self.arch in ("MixtralForCausalLM",
                                                          "Gemma3ForCausalLM") else 10000.0)
        inv_freq = 1.0 / (float(theta) ** (np.arange(0, d, 2) / d))
        scaling = c.get("rope_scaling")
        local_base = theta if self.gemma2 or self.olmo3 else c.get("rope_local_base_freq",
                                                                    10000.0)
        self.local_inv_freq = 1.0 / (float(local_base) ** (np.arange(0, d, 2) / d))
        kind = scaling and scaling.get("rope_type", scaling.get("type"))
        if kind in ("longrope", "su"):
            positions = c.get("max_position_embeddings", 4096)
            original = c.get("original_max_position_embeddings",
                             scaling.get("original_max_position_embeddings", positions))
            use_long = (max_model_len or positions) > original
            factors = np.array(scaling["long_factor" if use_long else "short_factor"])
            inv_freq = 1.0 / (factors * float(theta) ** (np.arange(0, d, 2) / d))
            ratio = positions / original
            default = 1.0 if ratio <= 1 else math.sqrt(1 + math.log(ratio) / math.log(original))
            self.mscale = scaling.get("attention_factor") or default
        elif kind == "linear":
            inv_freq = inv_freq / scaling["factor"]
        elif kind == "yarn":
            # transformers' _compute_yarn_parameters.
            factor = scaling["factor"]
            original = (scaling.get("original_max_position_embeddings")
                        or c["max_position_embeddings"])

            def get_mscale(scale, mscale=1.0):
                return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0

            self.mscale = scaling.get("attention_factor")
            if self.mscale is None:
                mscale, mscale_all_dim = scaling.get("mscale"), scaling.get("mscale_all_dim")
                self.mscale = (get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)
                               if mscale and mscale_all_dim else get_mscale(factor))

            def correction_dim(rotations):
                return (d * math.log(original / (rotations * 2 * math.pi))) / (
                    2 * math.log(float(theta)))

            low = correction_dim(scaling.get("beta_fast") or 32)
            high = correction_dim(scaling.get("beta_slow") or 1)
            if scaling.get("truncate", True):
                low, high = math.floor(low), math.ceil(high)
            low, high = max(low, 0), min(high, d - 1)
            if low == high:
                high += 0.001
            extrapolation = 1 - np.clip((np.arange(d // 2) - low) / (high - low), 0, 1)
            inv_freq = inv_freq / factor * (1 - extrapolation) + inv_freq * extrapolation
        elif scaling:
            factor = scaling["factor"]
            low, high = scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
            original = scaling["original_max_position_embeddings"]
            wavelen = 2 * math.pi / inv_freq
            smooth = (original / wavelen - low) / (high - low)
            scaled = np.where(wavelen > original / low, inv_freq / factor, inv_freq)
            mid = (wavelen >= original / high) & (wavelen <= original / low)
            inv_freq = np.where(mid, (1 - smooth) * inv_freq / factor + smooth * inv_freq, scaled)
        self.inv_freq = inv_freq
        # Ministral 3's query scale per position (1 without one).
        beta = (scaling or {}).get("llama_4_scaling_beta") if self.ministral3 else None
        self.query_scale = (lambda p: 1 + beta * np.log(
            1 + np.floor(p / scaling["original_max_position_embeddings"]))) if beta else (
                lambda p: np.ones_like(p))

    def rms(self, x, weight):
        eps = self.config.get("rms_norm_eps",
                              1e-5 if self.arch in ("MixtralForCausalLM", "Phi3ForCausalLM",
                                                    "Olmo2ForCausalLM", "Olmo3ForCausalLM",
                                                    "Ministral3ForCausalLM",
                                                    "Glm4MoeForCausalLM", "GptOssForCausalLM")
                              else 1.5625e-7 if self.glm else 1e-6)
        scale = 1.0 + weight if self.gemma else weight
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * scale

    def sliding(self, i):
        c = self.config
        if self.phi3 or self.arch in ("MistralForCausalLM", "MixtralForCausalLM",
                                      "Ministral3ForCausalLM"):
            return bool(c.get("sliding_window"))
        if not self.gemma and not self.olmo3 and not self.gpt_oss:
            return False
        if c.get("layer_types"):
            return c["layer_types"][i] == "sliding_attention"
        if self.gpt_oss:
            return i % 2 == 0
        if self.olmo3:
            return (i + 1) % 4 != 0
        if self.gemma2:
            return i % 2 == 0
        return (i + 1) % c.get("sliding_window_pattern", 6) != 0

    def rope(self, x, positions, local=False):
        # x: [n, heads, d]; rotate halves (i, i + r/2) of the first r =
        # rotary_dim values together, the rest passed. A local layer (Gemma's
        # or OLMo 3's sliding one) takes its own frequencies, unscaled.
        inv_freq = self.local_inv_freq if local else self.inv_freq
        mscale = 1.0 if local else self.mscale
        angles = positions[:, None] * inv_freq[None, :]
        cos = np.cos(angles)[:, None, :] * mscale
        sin = np.sin(angles)[:, None, :] * mscale
        half = self.rotary_dim // 2
        if self.glm:
            # GLM: cos and sin repeated pairwise over the rotary dims,
            # rotate_half(x) = stack(-x[1::2], x[0::2]) interleaved.
            cos2, sin2 = np.repeat(cos, 2, axis=-1), np.repeat(sin, 2, axis=-1)
            r = x[..., :self.rotary_dim]
            turned = np.stack([-r[..., 1::2], r[..., 0::2]], axis=-1).reshape(r.shape)
            return np.concatenate([r * cos2 + turned * sin2, x[..., self.rotary_dim:]], axis=-1)
        a, b = x[..., :half], x[..., half:self.rotary_dim]
        return np.concatenate([a * cos - b * sin, b * cos + a * sin, x[..., self.rotary_dim:]],
                              axis=-1)

    def is_moe_layer(self, i):
        c = self.config
        first_moe = c.get("first_k_dense_replace", 1) if self.glm4_moe else 0
        return (self.experts > 0 and i >= first_moe
                and (i + 1) % c.get("decoder_sparse_step", 1) == 0
                and i not in (c.get("mlp_only_layers") or []))

    def route(self, h, p):
        """The experts each row of h chooses, best first, with their weights,
        and the narrowest gap a choice was made by (between the last chosen
        and the first left out: the experts' ranks, and with groups the
        groups')."""
        w, c = self.w, self.config
        block = p + self.block
        if self.gpt_oss or self.granite_moe:
            # GPT-OSS's router has a bias; Granite MoE's is router.layer.
            logits = (h @ w[block + "router.weight"].T + w[block + "router.bias"] if self.gpt_oss
                      else h @ w[block + "router.layer.weight"].T)
            chosen = np.argsort(-logits, axis=-1, kind="stable")[:, : self.k]
            top = np.take_along_axis(logits, chosen, axis=-1)
            weights = np.exp(top - top.max(axis=-1, keepdims=True))
            weights /= weights.sum(axis=-1, keepdims=True)
            ordered = np.sort(logits, axis=-1)[:, ::-1]
            return chosen, weights, float((ordered[:, self.k - 1] - ordered[:, self.k]).min())
        logits = h @ w[block + "gate.weight"].T
        if not self.sigmoid:
            probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
            probs /= probs.sum(axis=-1, keepdims=True)
            chosen = np.argsort(-probs, axis=-1, kind="stable")[:, : self.k]
            weights = np.take_along_axis(probs, chosen, axis=-1)
            if self.normalize:
                weights /= weights.sum(axis=-1, keepdims=True)
            ordered = np.sort(logits, axis=-1)[:, ::-1]
            return chosen, weights, float((ordered[:, self.k - 1] - ordered[:, self.k]).min())
        scores = 1 / (1 + np.exp(-logits))
        biased = scores + w[block + "gate.e_score_correction_bias"]
        groups, chosen_groups = c.get("n_group", 1), c.get("topk_group", 1)
        gap = float("inf")
        if groups > 1:
            grouped = biased.reshape(len(h), groups, -1)
            group_scores = np.sort(grouped, axis=-1)[..., ::-1][..., :2].sum(axis=-1)
            order = np.argsort(-group_scores, axis=-1, kind="stable")
            if chosen_groups < groups:
                ranked = np.take_along_axis(group_scores, order, axis=-1)
                gap = float((ranked[:, chosen_groups - 1] - ranked[:, chosen_groups]).min())
            allowed = np.zeros((len(h), groups), dtype=bool)
            np.put_along_axis(allowed, order[:, :chosen_groups], True, axis=-1)
            biased = np.where(np.repeat(allowed, biased.shape[1] // groups, axis=1), biased,
                              -np.inf)
        chosen = np.argsort(-biased, axis=-1, kind="stable")[:, : self.k]
        ordered = np.sort(biased, axis=-1)[:, ::-1]
        if self.k < np.isfinite(biased).sum(axis=-1).min():
            gap = min(gap, float((ordered[:, self.k - 1] - ordered[:, self.k]).min()))
        weights = np.take_along_axis(scores, chosen, axis=-1)
        if self.normalize:
            weights /= weights.sum(axis=-1, keepdims=True) + 1e-20
        return chosen, weights * c.get("routed_scaling_factor", 1.0), gap

    def mlp(self, h, p, i):
        w = self.w
        if not self.is_moe_layer(i):
            gate = h @ w[p + "mlp.gate_proj.weight"].T
            up = h @ w[p + "mlp.up_proj.weight"].T
            if self.gemma:
                act = 0.5 * gate * (1 + np.tanh(math.sqrt(2 / math.pi)
                                                * (gate + 0.044715 * gate ** 3)))
            else:
                act = gate / (1 + np.exp(-gate))
            return (act * up) @ w[p + "mlp.down_proj.weight"].T
        block = p + self.block
        chosen, weights, _ = self.route(h, p)
        out = np.zeros_like(h)
        if self.gpt_oss:
            limit = self.config.get("swiglu_limit", 7.0)
            experts = block + "experts."
            for e in range(self.experts):
                rows, slots = np.nonzero(chosen == e)
                if len(rows) == 0:
                    continue
                gate_up = (h[rows] @ w[experts + "gate_up_proj"][e]
                           + w[experts + "gate_up_proj_bias"][e])
                gate = np.minimum(gate_up[:, ::2], limit)
                up = np.clip(gate_up[:, 1::2], -limit, limit)
                glu = gate / (1 + np.exp(-1.702 * gate))
                y = ((up + 1) * glu) @ w[experts + "down_proj"][e] + w[experts + "down_proj_bias"][e]
                out[rows] += weights[rows, slots][:, None] * y
            return out
        if self.granite_moe:
            # transformers' GraniteMoeParallelExperts: input_linear's first
            # half the gate, the second the up.
            for e in range(self.experts):
                rows, slots = np.nonzero(chosen == e)
                if len(rows) == 0:
                    continue
                gate, up = np.split(h[rows] @ w[block + "input_linear.weight"][e].T, 2, axis=-1)
                y = (gate / (1 + np.exp(-gate)) * up) @ w[block + "output_linear.weight"][e].T
                out[rows] += weights[rows, slots][:, None] * y
            return out
        gate_name, up_name, down_name = self.names
        for e in range(self.experts):
            rows, slots = np.nonzero(chosen == e)
            if len(rows) == 0:
                continue
            x = h[rows]
            prefix = f"{block}experts.{e}."
            gate = x @ w[prefix + gate_name + ".weight"].T
            up = x @ w[prefix + up_name + ".weight"].T
            y = (gate / (1 + np.exp(-gate)) * up) @ w[prefix + down_name + ".weight"].T
            out[rows] += weights[rows, slots][:, None] * y
        # GLM-4.5's shared experts; Qwen2-MoE's shared expert, weighed by
        # the sigmoid of its gate.
        for prefix in (block + "shared_experts.", block + "shared_expert."):
            if prefix + "gate_proj.weight" not in w:
                continue
            gate = h @ w[prefix + "gate_proj.weight"].T
            up = h @ w[prefix + "up_proj.weight"].T
            y = (gate / (1 + np.exp(-gate)) * up) @ w[prefix + "down_proj.weight"].T
            if block + "shared_expert_gate.weight" in w:
                y = y / (1 + np.exp(-(h @ w[block + "shared_expert_gate.weight"].T)))
            out += y
        return out

    def last_logits(self, tokens):
        w, c = self.w, self.config
        n = len(tokens)
        x = w["model.embed_tokens.weight"][np.array(tokens)]
        positions = np.arange(n, dtype=np.float64)
        mask = np.triu(np.full((n, n), -np.inf), k=1)
        scale = 1 / math.sqrt(self.head_dim)
        if self.gemma:
            bf16 = c.get("torch_dtype", c.get("dtype")) == "bfloat16"
            normalizer = np.float32(math.sqrt(c["hidden_size"]))
            x = x * (round_bf16(normalizer) if bf16 else float(normalizer))
            if bf16:
                x = round_bf16(x)
            scale = c.get("query_pre_attn_scalar", 256) ** -0.5
        residual = 1.0
        if self.granite:
            bf16 = c.get("torch_dtype", c.get("dtype")) == "bfloat16"
            x = x * float(np.float32(c.get("embedding_multiplier", 1.0)))
            if bf16:
                x = round_bf16(x)
            scale = c.get("attention_multiplier", 1.0)
            residual = c.get("residual_multiplier", 1.0)
        if self.gemma or self.olmo3 or self.gpt_oss or c.get("sliding_window"):
            window = c.get("sliding_window", 4096)
            rows, cols = np.indices((n, n))
            sliding_mask = np.where((cols <= rows) & (rows - cols < window), 0.0, -np.inf)
        group = self.heads // self.kv_heads
        for i in range(c["num_hidden_layers"]):
            p = f"model.layers.{i}."
            h = x if self.olmo2 else self.rms(x, w[p + "input_layernorm.weight"])
            q = h @ w[p + "self_attn.q_proj.weight"].T
            k = h @ w[p + "self_attn.k_proj.weight"].T
            v = h @ w[p + "self_attn.v_proj.weight"].T
            if p + "self_attn.q_proj.bias" in w:  # Qwen2's and GLM's q/k/v biases
                q = q + w[p + "self_attn.q_proj.bias"]
                k = k + w[p + "self_attn.k_proj.bias"]
                v = v + w[p + "self_attn.v_proj.bias"]
            if self.qk_norm_whole:
                q = self.rms(q, w[p + "self_attn.q_norm.weight"])
                k = self.rms(k, w[p + "self_attn.k_norm.weight"])
            q = q.reshape(n, self.heads, self.head_dim)
            k = k.reshape(n, self.kv_heads, self.head_dim)
            v = v.reshape(n, self.kv_heads, self.head_dim)
            if self.qk_norm and not self.qk_norm_whole:
                q = self.rms(q, w[p + "self_attn.q_norm.weight"])
                k = self.rms(k, w[p + "self_attn.k_norm.weight"])
            local = (self.gemma or self.olmo3) and self.sliding(i)
            if self.rotates[i]:  # SmolLM3's NoPE layers leave q and k as they are
                q, k = self.rope(q, positions, local), self.rope(k, positions, local)
            q = q * self.query_scale(positions)[:, None, None]
            k = np.repeat(k, group, axis=1)
            v = np.repeat(v, group, axis=1)
            layer_mask = sliding_mask if self.sliding(i) else mask
            scores = np.einsum("qhd,khd->hqk", q, k) * scale
            if self.gemma and c.get("attn_logit_softcapping"):
                cap = c["attn_logit_softcapping"]
                scores = np.tanh(scores / cap) * cap
            scores = scores + layer_mask
            sinks = w.get(p + "self_attn.sinks")
            if sinks is not None:
                # GPT-OSS: one more column per head, softmaxed with the
                # scores, then dropped.
                scores = np.concatenate(
                    [scores, np.broadcast_to(sinks[:, None, None], (self.heads, n, 1))], axis=-1)
            scores -= scores.max(axis=-1, keepdims=True)
            probs = np.exp(scores)
            probs /= probs.sum(axis=-1, keepdims=True)
            if sinks is not None:
                probs = probs[..., :-1]
            attn = np.einsum("hqk,khd->qhd", probs, v).reshape(n, -1)
            out = attn @ w[p + "self_attn.o_proj.weight"].T
            if p + "self_attn.o_proj.bias" in w:
                out = out + w[p + "self_attn.o_proj.bias"]
            if self.olmo2:
                x = x + self.rms(out, w[p + "post_attention_layernorm.weight"])
                x = x + self.rms(self.mlp(x, p, i), w[p + "post_feedforward_layernorm.weight"])
                continue
            if self.glm4:
                x = x + self.rms(out, w[p + "post_self_attn_layernorm.weight"])
                h = self.rms(x, w[p + "post_attention_layernorm.weight"])
                x = x + self.rms(self.mlp(h, p, i), w[p + "post_mlp_layernorm.weight"])
                continue
            if self.gemma:
                x = x + self.rms(out, w[p + "post_attention_layernorm.weight"])
                h = self.rms(x, w[p + "pre_feedforward_layernorm.weight"])
                x = x + self.rms(self.mlp(h, p, i), w[p + "post_feedforward_layernorm.weight"])
                continue
            x = x + out * residual
            h = self.rms(x, w[p + "post_attention_layernorm.weight"])
            x = x + self.mlp(h, p, i) * residual
        last = self.rms(x[-1], w["model.norm.weight"])
        head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
        logits = head @ last
        if self.granite:
            logits = logits / c.get("logits_scaling", 1.0)
        if self.gemma and c.get("final_logit_softcapping"):
            cap = c["final_logit_softcapping"]
            logits = np.tanh(logits / cap) * cap
        return logits


def log_softmax(logits):
    m = logits.max()
    return logits - (m + math.log(np.exp(logits - m).sum()))


# ---- the two servers ------------------------------------------------------------------


def post(url, body, timeout=300):
    request = urllib.request.Request(url, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as error:
        sys.exit(f"llama_cpp_compare: {url} answered {error.code}: {error.read().decode()[:500]}")


def served_model(base):
    with urllib.request.urlopen(base + "/v1/models", timeout=60) as response:
        return json.loads(response.read())["data"][0]["id"]


def tandem_generate(base, prompt, max_tokens, top):
    body = {"model": served_model(base), "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "return_token_ids": True, "logprobs": top}
    choice = post(base + "/v1/completions", body)["choices"][0]
    first_top = sorted(choice["logprobs"]["top_logprobs"][0].values(), reverse=True)
    return choice["token_ids"], first_top


def llama_generate(base, prompt, max_tokens, top):
    # llama-server's own endpoint: it returns the generated token ids and the
    # top log-probabilities with their ids. temperature 0 is greedy.
    body = {"prompt": prompt, "n_predict": max_tokens, "temperature": 0, "ignore_eos": True,
            "return_tokens": True, "n_probs": top, "cache_prompt": False, "seed": 0}
    reply = post(base + "/completion", body)
    if "completion_probabilities" not in reply:
        # llama-server holds a token's probabilities back until its text is
        # whole UTF-8: an answer of lone bytes carries none (None: the
        # tokens still compare).
        return reply["tokens"], None
    first_top = sorted((p["logprob"] for p in reply["completion_probabilities"][0]["top_logprobs"]),
                       reverse=True)
    return reply["tokens"], first_top


def cmd_correctness(args):
    config = load(os.path.join(args.model, "config.json"))
    tokenizer = load(os.path.join(args.model, "tokenizer.json"))
    text_vocab = len(tokenizer["model"]["vocab"])  # ids of real text tokens: [0, text_vocab)
    rng = np.random.default_rng(args.seed)
    lengths = [int(x) for x in args.lengths.split(",")]
    prompts = [[int(t) for t in rng.integers(0, text_vocab, size=n)] for n in lengths]
    top = 20
    reference = Reference(args.model)
    results = []
    agree_tokens = total_tokens = 0
    errors = {"tandem": [], "llama_cpp": []}
    for index, prompt in enumerate(prompts):
        t_tokens, t_top = tandem_generate(args.tandem_url, prompt, args.max_tokens, top)
        l_tokens, l_top = llama_generate(args.llama_url, prompt, args.max_tokens, top)
        ref_logits = reference.last_logits(prompt)
        ref_lp = log_softmax(ref_logits)
        ref_top = np.sort(ref_lp)[::-1][:top]
        scale = float(np.abs(ref_logits).max())
        # The ten largest log-probabilities, each side sorted: Tandem's
        # /v1/completions keys them by token text, so ids are not compared.
        k = min(10, len(t_top), len(l_top) if l_top is not None else 10)
        t_err = float(np.max(np.abs(np.array(t_top[:k]) - ref_top[:k])))
        l_err = (None if l_top is None else
                 float(np.max(np.abs(np.array(l_top[:k]) - ref_top[:k]))))
        errors["tandem"].append(t_err / scale)
        if l_err is not None:
            errors["llama_cpp"].append(l_err / scale)
        same = 0
        for a, b in zip(t_tokens, l_tokens):
            if a != b:
                break
            same += 1
        agree = sum(1 for a, b in zip(t_tokens, l_tokens) if a == b)
        agree_tokens += agree
        total_tokens += max(len(t_tokens), len(l_tokens))
        entry = {"prompt_tokens": len(prompt), "generated": len(t_tokens),
                 "agreeing_positions": agree, "first_divergence": None,
                 "tandem_top10_logprob_abs_err": t_err, "llama_cpp_top10_logprob_abs_err": l_err,
                 "reference_max_abs_logit": scale,
                 "tandem_rel_err": t_err / scale,
                 "llama_cpp_rel_err": None if l_err is None else l_err / scale}
        if same < min(len(t_tokens), len(l_tokens)):
            context = prompt + t_tokens[:same]
            logits = reference.last_logits(context)
            order = np.argsort(logits)[::-1]
            gap = float(logits[order[0]] - logits[order[1]])
            entry["first_divergence"] = {
                "position": same, "tandem_token": t_tokens[same], "llama_cpp_token": l_tokens[same],
                "reference_top2": [int(order[0]), int(order[1])], "reference_top2_gap": gap,
                "reference_picks": ("tandem" if int(order[0]) == t_tokens[same] else
                                    "llama_cpp" if int(order[0]) == l_tokens[same] else "neither"),
            }
        results.append(entry)
    worst = {k: max(v) if v else None for k, v in errors.items()}
    # A divergence is a near-tie when the two engines picked the reference's
    # top two tokens and the reference's gap between them is below what the
    # less exact engine's error could flip (twice its largest absolute
    # log-probability error seen on these prompts).
    largest_abs = max(max(r["tandem_top10_logprob_abs_err"], r["llama_cpp_top10_logprob_abs_err"]
                          if r["llama_cpp_top10_logprob_abs_err"] is not None else 0.0)
                      for r in results)
    for r in results:
        d = r["first_divergence"]
        if d:
            picked = {d["tandem_token"], d["llama_cpp_token"]}
            d["near_tie"] = (picked == set(d["reference_top2"])
                             and d["reference_top2_gap"] < 2 * largest_abs)
    out = {"dtype": args.dtype, "prompts": len(prompts), "max_tokens": args.max_tokens,
           "agreeing_tokens": agree_tokens, "total_tokens": total_tokens,
           "tandem_max_rel_err": worst["tandem"], "llama_cpp_max_rel_err": worst["llama_cpp"],
           "per_prompt": results}
    print(f"correctness {args.dtype}: {agree_tokens}/{total_tokens} greedy tokens agree "
          f"({len(prompts)} prompts of {args.lengths} tokens, {args.max_tokens} generated each)")
    def error(value):
        # None: llama-server gave no log-probabilities (text not whole UTF-8).
        return "none given" if value is None else f"{value:.2e}"

    for i, r in enumerate(results):
        d = r["first_divergence"]
        where = "identical" if d is None else (
            f"first divergence at token {d['position']}: Tandem {d['tandem_token']}, llama.cpp "
            f"{d['llama_cpp_token']}; reference top-2 {d['reference_top2']} gap "
            f"{d['reference_top2_gap']:.2e} ({'near-tie' if d['near_tie'] else 'NOT a near-tie'}; "
            f"reference picks {d['reference_picks']})")
        print(f"  prompt {i} ({r['prompt_tokens']} tokens): {r['agreeing_positions']}/"
              f"{r['generated']} agree, {where}; last-position top-10 log-prob error vs float64: "
              f"Tandem {error(r['tandem_top10_logprob_abs_err'])}, llama.cpp "
              f"{error(r['llama_cpp_top10_logprob_abs_err'])}")
    print(f"  max relative error vs float64 (top-10 log-prob error / max |reference logit|): "
          f"Tandem {error(worst['tandem'])}, llama.cpp {error(worst['llama_cpp'])}")
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=2)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("round")
    for name in ("--dtype", "--llama", "--tandem", "--tandem-short", "--out"):
        r.add_argument(name, required=True)
    r.add_argument("--round", type=int, required=True)
    s = sub.add_parser("summary")
    s.add_argument("--rounds", nargs="+", required=True)
    s.add_argument("--out", required=True)
    c = sub.add_parser("correctness")
    for name in ("--model", "--tandem-url", "--llama-url", "--dtype", "--out"):
        c.add_argument(name, required=True)
    c.add_argument("--lengths", default="1,5,17,40,77,128,200,300")
    c.add_argument("--max-tokens", type=int, default=32)
    c.add_argument("--seed", type=int, default=16)
    args = parser.parse_args()
    {"round": cmd_round, "summary": cmd_summary, "correctness": cmd_correctness}[args.command](args)


if __name__ == "__main__":
    main()
