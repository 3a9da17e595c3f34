#!/usr/bin/env python3
"""Converts a Tandem (Hugging Face layout) Llama, Mixtral, Qwen2-MoE, Qwen3-MoE, GLM-4.5, GPT-OSS, Granite MoE or OLMoE model directory to GGUF.

Reads config.json, tokenizer.json and model.safetensors (header + data, no
torch or safetensors package needed) and writes one GGUF file with llama.cpp's
gguf-py (found through PYTHONPATH, or --gguf-py) as the writer library:
architecture `llama` for Llama and Mixtral (its experts stacked into
ffn_gate_exps/ffn_up_exps/ffn_down_exps, its router as ffn_gate_inp), and
`qwen3moe` for Qwen3-MoE (q/k norms; llama.cpp renormalizes the chosen
experts' weights and has no dense layers in it, so norm_topk_prob must be
true, mlp_only_layers empty and decoder_sparse_step 1), and `glm4moe` for
GLM-4.5 (Glm4MoeForCausalLM: q/k/v biases, optional q/k norms, partial
rotary dims as the rope dimension count, sigmoid routing with the
correction bias as exp_probs_b, expert groups, the routed scale, shared
experts as ffn_*_shexp, the first first_k_dense_replace layers dense; no
multi-token-prediction layer is written), and `qwen2moe` for Qwen2-MoE
(q/k/v biases, the shared expert as ffn_*_shexp with its gate as
ffn_gate_inp_shexp; llama.cpp neither renormalizes nor has dense layers
there, so norm_topk_prob must be false, mlp_only_layers empty and
decoder_sparse_step 1), and `gpt-oss` for GPT-OSS (its experts as
transformers holds them in bf16 or f32, split into gate and up and
transposed, or as published in MXFP4, split into gate and up and written as
ggml's MXFP4 blocks, the same values; with their biases; the router's bias;
q/k/v and o_proj biases; the sinks as attn_sinks; llama.cpp's swiglu limit
is 7 and its windows are on every other layer from the first, so
swiglu_limit must be 7 and layer_types alternate so), `olmoe` for OLMoE
(q/k norms across the heads, halves rotating as Hugging Face does; llama.cpp
neither renormalizes nor scales the rotary frequencies there, and its k norm
spans all query heads, so norm_topk_prob must be false, rope_scaling null
and num_key_value_heads num_attention_heads, as published), and `granitemoe`
for Granite MoE (Granite's four scalars as attention.scale,
embedding_scale, residual_scale and logit_scale; its stacked input_linear
split into gate and up; q/k rows permuted as Llama's):

  scripts/tandem-to-gguf.py --model models/small --out small-bf16.gguf --dtype bf16
  scripts/tandem-to-gguf.py --model models/small --f32-model-dir models/small-f32

--dtype bf16 keeps 2-D weights in bf16 (f32 sources are rounded to nearest
even); --dtype f32 widens them (exact for bf16 sources). Norm weights are
always f32, as llama.cpp expects. --f32-model-dir instead writes a Tandem
model directory whose weights are the same values widened to f32 (the f32
side of a comparison on identical weights).

q_proj and k_proj rows are permuted per head for `llama`: Hugging Face
rotates the two halves of a head (i, i + d/2) together, llama.cpp's `llama`
rope rotates adjacent pairs (2i, 2i + 1), so row i + h·d/2 of a head goes to
row 2i + h. `qwen2moe`, `qwen3moe` and `glm4moe` rotate halves as Hugging
Face does: no permutation.
"""

import argparse
import json
import math
import os
import shutil
import struct
import sys

import numpy as np

SAFETENSORS_DTYPES = {"BF16": (np.uint16, 2), "F16": (np.float16, 2), "F32": (np.float32, 4),
                      "U8": (np.uint8, 1)}


def read_safetensors(path):
    """Returns {name: (dtype string, shape, numpy array of the raw elements)}."""
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_len))
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + header_len)
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = info["dtype"]
        if dtype not in SAFETENSORS_DTYPES:
            sys.exit(f"tandem-to-gguf: tensor {name} has dtype {dtype}; accepted: BF16, F16, F32, "
                     "U8 (MXFP4 blocks and scales)")
        np_dtype, size = SAFETENSORS_DTYPES[dtype]
        begin, end = info["data_offsets"]
        shape = tuple(info["shape"])
        count = int(np.prod(shape)) if shape else 1
        if end - begin != count * size:
            sys.exit(f"tandem-to-gguf: tensor {name}: {end - begin} bytes for shape {shape}")
        tensors[name] = (dtype, shape, data[begin:end].view(np_dtype).reshape(shape))
    return tensors


def to_f32(dtype, array):
    if dtype == "BF16":
        return (array.astype(np.uint32) << 16).view(np.float32)
    return array.astype(np.float32)


def to_bf16_bits(dtype, array):
    """bf16 bit patterns (uint16), rounding f32 to nearest even."""
    if dtype == "BF16":
        return np.ascontiguousarray(array)
    bits = to_f32(dtype, array).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def ggml_mxfp4(blocks, scales):
    """MXFP4 as published ([..., blocks, 16] bytes, element 2b in byte b's
    low nibble and 2b + 1 in its high one; [..., blocks] E8M0 scales) as
    ggml's block_mxfp4 rows: per block the scale byte, then 16 bytes whose
    byte j holds element j (low nibble) and element j + 16 (high). Both give
    an element the value E2M1(nibble) * 2^(scale - 127) (ggml doubles the
    E2M1 table and halves the scale), so the matrix is the same."""
    nibbles = np.stack((blocks & 0x0F, blocks >> 4), axis=-1).reshape(*blocks.shape[:-1], 32)
    qs = nibbles[..., :16] | (nibbles[..., 16:] << 4)
    packed = np.concatenate((scales[..., None], qs), axis=-1)
    return np.ascontiguousarray(packed.reshape(*blocks.shape[:-2], blocks.shape[-2] * 17))


def permute_rope_rows(matrix, num_heads):
    """HF half-split rotary row order to llama.cpp's interleaved order."""
    rows = matrix.shape[0]
    head_dim = rows // num_heads
    return np.ascontiguousarray(
        matrix.reshape(num_heads, 2, head_dim // 2, *matrix.shape[1:])
        .swapaxes(1, 2)
        .reshape(matrix.shape))


def llama3_rope_factors(config, head_dim):
    """Per-frequency divisors of llama3 rope scaling (llama.cpp's rope_freqs)."""
    scaling = config["rope_scaling"]
    base = float(config.get("rope_theta", 10000.0))
    factor = float(scaling["factor"])
    low = float(scaling.get("low_freq_factor", 1.0))
    high = float(scaling.get("high_freq_factor", 4.0))
    original = float(scaling["original_max_position_embeddings"])
    low_wavelen = original / low
    high_wavelen = original / high
    factors = []
    for i in range(0, head_dim, 2):
        freq = 1.0 / base ** (i / head_dim)
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            factors.append(1.0)
        elif wavelen > low_wavelen:
            factors.append(factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            factors.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)


def add_tokenizer(writer, gguf, model_dir, config):
    with open(os.path.join(model_dir, "tokenizer.json"), encoding="utf-8") as f:
        tokenizer = json.load(f)
    model = tokenizer["model"]
    if model.get("type") != "BPE":
        sys.exit(f"tandem-to-gguf: tokenizer.json model type {model.get('type')}; accepted: BPE")
    vocab_size = int(config["vocab_size"])
    tokens = [None] * vocab_size
    types = [gguf.TokenType.UNUSED] * vocab_size
    for text, token_id in model["vocab"].items():
        if token_id < vocab_size:
            tokens[token_id] = text
            types[token_id] = gguf.TokenType.NORMAL
    for added in tokenizer.get("added_tokens", []):
        token_id = added["id"]
        if token_id < vocab_size:
            tokens[token_id] = added["content"]
            types[token_id] = (gguf.TokenType.CONTROL
                               if added.get("special") else gguf.TokenType.USER_DEFINED)
    # Ids past the tokenizer's vocabulary exist in the weights only.
    for token_id in range(vocab_size):
        if tokens[token_id] is None:
            tokens[token_id] = f"[PAD{token_id}]"
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    writer.add_tokenizer_model("gpt2")
    # tokenizer.json's split regex is Llama 3's; llama.cpp names it llama-bpe.
    writer.add_tokenizer_pre("llama-bpe")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    eos = config.get("eos_token_id")
    eos_ids = eos if isinstance(eos, list) else ([eos] if eos is not None else [])
    if eos_ids:
        writer.add_eos_token_id(int(eos_ids[-1]))
        writer.add_bos_token_id(int(eos_ids[0]))
    if config.get("bos_token_id") is not None:
        writer.add_bos_token_id(int(config["bos_token_id"]))
    writer.add_add_bos_token(False)


def convert(model_dir, out_path, dtype):
    import gguf  # llama.cpp's gguf-py

    with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    archs = config.get("architectures", [])
    accepted = ["LlamaForCausalLM", "MixtralForCausalLM", "Qwen2MoeForCausalLM",
                "Qwen3MoeForCausalLM", "Glm4MoeForCausalLM", "GptOssForCausalLM",
                "GraniteMoeForCausalLM", "OlmoeForCausalLM"]
    if len(archs) != 1 or archs[0] not in accepted:
        sys.exit(f"tandem-to-gguf: architectures {archs}; accepted: one of {accepted}")
    arch = archs[0]
    glm4moe = arch == "Glm4MoeForCausalLM"
    qwen2moe = arch == "Qwen2MoeForCausalLM"
    gptoss = arch == "GptOssForCausalLM"
    granitemoe = arch == "GraniteMoeForCausalLM"
    olmoe = arch == "OlmoeForCausalLM"
    if olmoe and (config.get("norm_topk_prob") or config.get("rope_scaling")
                  or config.get("clip_qkv") is not None
                  or config.get("num_key_value_heads", config["num_attention_heads"])
                  != config["num_attention_heads"]):
        sys.exit("tandem-to-gguf: OLMoE with norm_topk_prob, rope_scaling, clip_qkv or grouped "
                 "KV heads; accepted: norm_topk_prob false, rope_scaling and clip_qkv null, "
                 "num_key_value_heads = num_attention_heads (llama.cpp's olmoe)")
    if config.get("attention_bias") and not (glm4moe or qwen2moe or gptoss):
        sys.exit("tandem-to-gguf: attention_bias is true; accepted: false (GLM-4.5, "
                 "Qwen2-MoE, GPT-OSS: true)")
    # Qwen2-MoE's q/k/v biases (qkv_bias, true when absent); GLM-4.5's with
    # attention_bias; GPT-OSS's (o_proj's too) unless attention_bias is false.
    qkv_bias = ((qwen2moe and config.get("qkv_bias", True))
                or (glm4moe and config.get("attention_bias"))
                or (gptoss and config.get("attention_bias", True)))
    layers = int(config["num_hidden_layers"])
    if gptoss:
        alternating = ["sliding_attention" if i % 2 == 0 else "full_attention"
                       for i in range(layers)]
        if float(config.get("swiglu_limit", 7.0)) != 7.0 or \
                config.get("layer_types", alternating) != alternating:
            sys.exit("tandem-to-gguf: GPT-OSS with another swiglu_limit or layer_types; "
                     "accepted: 7, and every other layer sliding from the first (llama.cpp's "
                     "gpt-oss)")
    if qwen2moe and (config.get("norm_topk_prob") or config.get("mlp_only_layers")
                     or config.get("decoder_sparse_step", 1) != 1):
        sys.exit("tandem-to-gguf: Qwen2-MoE with norm_topk_prob, mlp_only_layers or "
                 "decoder_sparse_step; accepted: norm_topk_prob false, every layer a mixture "
                 "(llama.cpp's qwen2moe)")
    qwen3moe = arch == "Qwen3MoeForCausalLM"
    if qwen3moe and (not config.get("norm_topk_prob") or config.get("mlp_only_layers")
                     or config.get("decoder_sparse_step", 1) != 1):
        sys.exit("tandem-to-gguf: Qwen3-MoE with norm_topk_prob false, mlp_only_layers or "
                 "decoder_sparse_step; accepted: norm_topk_prob true, every layer a mixture "
                 "(llama.cpp's qwen3moe)")
    # The engine's (transformers') defaults where the config is silent.
    mixtral = arch == "MixtralForCausalLM"
    experts = (0 if arch == "LlamaForCausalLM" else
               int(config.get("num_local_experts", 8)) if mixtral else
               int(config.get("num_local_experts", 128)) if gptoss else
               int(config.get("num_local_experts", 8)) if granitemoe else
               int(config.get("num_experts", 64)) if olmoe else
               int(config.get("n_routed_experts", config.get("num_local_experts", 128)))
               if glm4moe else
               int(config.get("num_experts", config.get("num_local_experts",
                                                        60 if qwen2moe else 128))))
    experts_per_token = int(config.get("num_experts_per_tok",
                                       2 if mixtral or granitemoe else
                                       4 if qwen2moe or gptoss else 8))
    tensors = read_safetensors(os.path.join(model_dir, "model.safetensors"))
    hidden = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads", heads))
    head_dim = int(config.get("head_dim") or (64 if gptoss else hidden // heads))
    # GLM-4.5 (Glm4MoeConfig's defaults): part of each head rotates; the first
    # layers are dense.
    rotary_dim = int(head_dim * config.get(
        "partial_rotary_factor",
        (config.get("rope_parameters") or {}).get("partial_rotary_factor", 0.5))) \
        if glm4moe else head_dim
    dense_layers = int(config.get("first_k_dense_replace", 1)) if glm4moe else 0

    tmp = out_path + ".tmp"
    writer = gguf.GGUFWriter(tmp, "glm4moe" if glm4moe else "qwen3moe" if qwen3moe else
                             "qwen2moe" if qwen2moe else "gpt-oss" if gptoss else
                             "granitemoe" if granitemoe else "olmoe" if olmoe else "llama")
    writer.add_name(os.path.basename(os.path.normpath(model_dir)))
    writer.add_context_length(int(config["max_position_embeddings"]))
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(int(config["intermediate_size"]))
    if experts:
        writer.add_expert_count(experts)
        writer.add_expert_used_count(experts_per_token)
        if qwen3moe:
            writer.add_expert_feed_forward_length(int(config.get("moe_intermediate_size", 768)))
        if qwen2moe:
            writer.add_expert_feed_forward_length(int(config.get("moe_intermediate_size", 1408)))
            writer.add_expert_shared_feed_forward_length(
                int(config.get("shared_expert_intermediate_size", 5632)))
        if glm4moe:
            writer.add_expert_feed_forward_length(int(config.get("moe_intermediate_size", 1408)))
            writer.add_expert_shared_count(int(config.get("n_shared_experts", 1)))
            writer.add_leading_dense_block_count(dense_layers)
            writer.add_expert_weights_scale(float(config.get("routed_scaling_factor", 1.0)))
            writer.add_expert_weights_norm(bool(config.get("norm_topk_prob", True)))
            writer.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
            writer.add_expert_group_count(int(config.get("n_group", 1)))
            writer.add_expert_group_used_count(int(config.get("topk_group", 1)))
        if gptoss:
            writer.add_expert_feed_forward_length(int(config["intermediate_size"]))
    if gptoss:
        writer.add_sliding_window(int(config.get("sliding_window", 128)))
    if granitemoe:
        # GraniteMoeConfig's defaults: 1 each.
        writer.add_attention_scale(float(config.get("attention_multiplier", 1.0)))
        writer.add_embedding_scale(float(config.get("embedding_multiplier", 1.0)))
        writer.add_residual_scale(float(config.get("residual_multiplier", 1.0)))
        writer.add_logit_scale(float(config.get("logits_scaling", 1.0)))
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(rotary_dim)
    writer.add_rope_freq_base(float(config.get(
        "rope_theta", 1e6 if mixtral else 150000.0 if gptoss else 10000.0)))
    writer.add_layer_norm_rms_eps(float(config.get("rms_norm_eps",
                                                   1e-5 if mixtral or glm4moe or gptoss or olmoe
                                                   else 1e-6)))
    writer.add_vocab_size(int(config["vocab_size"]))
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_BF16 if dtype == "bf16"
                         else gguf.LlamaFileType.ALL_F32)
    add_tokenizer(writer, gguf, model_dir, config)

    def take(name):
        if name not in tensors:
            sys.exit(f"tandem-to-gguf: tensor {name} missing from model.safetensors")
        return tensors[name]

    def add_matrix(gguf_name, hf_name, rope_heads=None):
        src_dtype, _, array = take(hf_name)
        if dtype == "bf16":
            data = to_bf16_bits(src_dtype, array)
            if rope_heads:
                data = permute_rope_rows(data, rope_heads)
            writer.add_tensor(gguf_name, np.ascontiguousarray(data),
                              raw_dtype=gguf.GGMLQuantizationType.BF16)
        else:
            data = to_f32(src_dtype, array)
            if rope_heads:
                data = permute_rope_rows(data, rope_heads)
            writer.add_tensor(gguf_name, np.ascontiguousarray(data))

    def add_f32(gguf_name, hf_name, flatten=False):
        # Norm weights, biases, GLM-4.5's router and Qwen2-MoE's shared
        # expert gate (a [1, hidden] matrix llama.cpp reads as a vector):
        # f32, as llama.cpp's own converter writes them.
        src_dtype, _, array = take(hf_name)
        data = to_f32(src_dtype, array)
        writer.add_tensor(gguf_name, np.ascontiguousarray(data.reshape(-1) if flatten else data))

    def add_stacked(gguf_name, src_dtype, array):
        # One [experts, rows, cols] tensor in the file's dtype.
        data = np.ascontiguousarray(to_bf16_bits(src_dtype, array) if dtype == "bf16"
                                    else to_f32(src_dtype, array))
        if dtype == "bf16":
            writer.add_tensor(gguf_name, data, raw_dtype=gguf.GGMLQuantizationType.BF16)
        else:
            writer.add_tensor(gguf_name, data)

    def add_experts(gguf_name, hf_names):
        # One [experts, rows, cols] tensor of the experts' matrices in order.
        parts = [take(hf_name) for hf_name in hf_names]
        add_stacked(gguf_name, parts[0][0], np.stack([array for _, _, array in parts]))

    def gpt_oss_experts(i, block):
        # transformers' [experts, in, out] matrices, gate and up interleaved
        # in the columns (gate the even ones), as [experts, out, in] each; or
        # the published MXFP4 [experts, out, in / 32, 16] blocks, gate and up
        # interleaved in the rows, as ggml MXFP4 rows.
        add_matrix(f"blk.{i}.ffn_gate_inp.weight", block + "router.weight")
        add_f32(f"blk.{i}.ffn_gate_inp.bias", block + "router.bias")
        if block + "experts.gate_up_proj_blocks" in tensors:
            _, _, gate_up = take(block + "experts.gate_up_proj_blocks")
            _, _, gate_up_scales = take(block + "experts.gate_up_proj_scales")
            _, _, down = take(block + "experts.down_proj_blocks")
            _, _, down_scales = take(block + "experts.down_proj_scales")
            parts = {"gate": (gate_up[:, 0::2], gate_up_scales[:, 0::2]),
                     "up": (gate_up[:, 1::2], gate_up_scales[:, 1::2]),
                     "down": (down, down_scales)}
            for part, (blocks, scales) in parts.items():
                writer.add_tensor(f"blk.{i}.ffn_{part}_exps.weight", ggml_mxfp4(blocks, scales),
                                  raw_dtype=gguf.GGMLQuantizationType.MXFP4)
        else:
            src_dtype, _, gate_up = take(block + "experts.gate_up_proj")
            _, _, down = take(block + "experts.down_proj")
            parts = {"gate": gate_up.transpose(0, 2, 1)[:, 0::2, :],
                     "up": gate_up.transpose(0, 2, 1)[:, 1::2, :],
                     "down": down.transpose(0, 2, 1)}
            for part, data in parts.items():
                add_stacked(f"blk.{i}.ffn_{part}_exps.weight", src_dtype, data)
        bias_dtype, _, gate_up_bias = take(block + "experts.gate_up_proj_bias")
        bias = to_f32(bias_dtype, gate_up_bias)
        writer.add_tensor(f"blk.{i}.ffn_gate_exps.bias", np.ascontiguousarray(bias[:, 0::2]))
        writer.add_tensor(f"blk.{i}.ffn_up_exps.bias", np.ascontiguousarray(bias[:, 1::2]))
        add_f32(f"blk.{i}.ffn_down_exps.bias", block + "experts.down_proj_bias")

    def granite_moe_experts(i, block):
        # input_linear [experts, 2 x width, hidden]: each expert's gate rows,
        # then its up rows; output_linear [experts, hidden, width].
        add_matrix(f"blk.{i}.ffn_gate_inp.weight", block + "router.layer.weight")
        src_dtype, _, gate_up = take(block + "input_linear.weight")
        _, _, down = take(block + "output_linear.weight")
        width = gate_up.shape[1] // 2
        for part, data in (("gate", gate_up[:, :width, :]), ("up", gate_up[:, width:, :]),
                           ("down", down)):
            add_stacked(f"blk.{i}.ffn_{part}_exps.weight", src_dtype, data)

    add_matrix("token_embd.weight", "model.embed_tokens.weight")
    scaling = config.get("rope_scaling")
    if scaling and gptoss:
        # YaRN, as llama.cpp's converter writes GPT-OSS's (its beta_fast and
        # beta_slow are llama.cpp's defaults, 32 and 1; llama.cpp rounds the
        # blend's bounds whatever truncate says).
        kind = scaling.get("rope_type", scaling.get("type"))
        if kind != "yarn" or scaling.get("beta_fast", 32) != 32 or \
                scaling.get("beta_slow", 1) != 1 or "attention_factor" in scaling:
            sys.exit("tandem-to-gguf: GPT-OSS rope_scaling; accepted: yarn with beta_fast 32, "
                     "beta_slow 1 and the default attention factor")
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(float(scaling["factor"]))
        writer.add_rope_scaling_orig_ctx_len(int(scaling["original_max_position_embeddings"]))
    elif scaling:
        kind = scaling.get("rope_type", scaling.get("type"))
        if kind != "llama3":
            sys.exit(f"tandem-to-gguf: rope_scaling type {kind}; accepted: llama3 or none")
        writer.add_tensor("rope_freqs.weight", llama3_rope_factors(config, head_dim))
    for i in range(layers):
        p = f"model.layers.{i}."
        add_f32(f"blk.{i}.attn_norm.weight", p + "input_layernorm.weight")
        halves = qwen3moe or glm4moe or qwen2moe or gptoss or olmoe
        add_matrix(f"blk.{i}.attn_q.weight", p + "self_attn.q_proj.weight",
                   None if halves else heads)
        add_matrix(f"blk.{i}.attn_k.weight", p + "self_attn.k_proj.weight",
                   None if halves else kv_heads)
        add_matrix(f"blk.{i}.attn_v.weight", p + "self_attn.v_proj.weight")
        add_matrix(f"blk.{i}.attn_output.weight", p + "self_attn.o_proj.weight")
        if qkv_bias:
            for part in ("q", "k", "v"):
                add_f32(f"blk.{i}.attn_{part}.bias", p + f"self_attn.{part}_proj.bias")
        if gptoss:
            if qkv_bias:
                add_f32(f"blk.{i}.attn_output.bias", p + "self_attn.o_proj.bias")
            add_f32(f"blk.{i}.attn_sinks.weight", p + "self_attn.sinks")
        if qwen3moe or olmoe or (glm4moe and config.get("use_qk_norm")):
            add_f32(f"blk.{i}.attn_q_norm.weight", p + "self_attn.q_norm.weight")
            add_f32(f"blk.{i}.attn_k_norm.weight", p + "self_attn.k_norm.weight")
        # llama.cpp's glm4moe names the norm before the MLP post_attention_norm.
        add_f32(f"blk.{i}.{'post_attention_norm' if glm4moe or gptoss else 'ffn_norm'}.weight",
                 p + "post_attention_layernorm.weight")
        if gptoss:
            gpt_oss_experts(i, p + "mlp.")
        elif granitemoe:
            granite_moe_experts(i, p + "block_sparse_moe.")
        elif experts and i >= dense_layers:
            block = p + ("mlp." if halves else "block_sparse_moe.")
            names = {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"} if halves else \
                {"gate": "w1", "up": "w3", "down": "w2"}
            (add_f32 if glm4moe else add_matrix)(f"blk.{i}.ffn_gate_inp.weight",
                                                  block + "gate.weight")
            for part in ("gate", "up", "down"):
                add_experts(f"blk.{i}.ffn_{part}_exps.weight",
                            [f"{block}experts.{e}.{names[part]}.weight" for e in range(experts)])
            if qwen2moe:
                add_f32(f"blk.{i}.ffn_gate_inp_shexp.weight", block + "shared_expert_gate.weight",
                        flatten=True)
                for part in ("gate", "up", "down"):
                    add_matrix(f"blk.{i}.ffn_{part}_shexp.weight",
                               f"{block}shared_expert.{part}_proj.weight")
            if glm4moe:
                add_f32(f"blk.{i}.exp_probs_b.bias", block + "gate.e_score_correction_bias")
                if int(config.get("n_shared_experts", 1)) > 0:
                    for part in ("gate", "up", "down"):
                        add_matrix(f"blk.{i}.ffn_{part}_shexp.weight",
                                   f"{block}shared_experts.{part}_proj.weight")
        else:
            add_matrix(f"blk.{i}.ffn_gate.weight", p + "mlp.gate_proj.weight")
            add_matrix(f"blk.{i}.ffn_up.weight", p + "mlp.up_proj.weight")
            add_matrix(f"blk.{i}.ffn_down.weight", p + "mlp.down_proj.weight")
    add_f32("output_norm.weight", "model.norm.weight")
    if config.get("tie_word_embeddings") and "lm_head.weight" not in tensors:
        add_matrix("output.weight", "model.embed_tokens.weight")
    else:
        add_matrix("output.weight", "lm_head.weight")

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(tmp, out_path)


def write_f32_model(model_dir, out_dir):
    """A Tandem model directory with the same weights widened to f32."""
    tensors = read_safetensors(os.path.join(model_dir, "model.safetensors"))
    packed = [name for name, (dtype, _, _) in tensors.items() if dtype == "U8"]
    if packed:
        sys.exit(f"tandem-to-gguf: {packed[0]} is MXFP4 (U8 blocks), which an f32 copy cannot "
                 "hold as it is; accepted for --f32-model-dir: bf16, f16 or f32 weights")
    os.makedirs(out_dir, exist_ok=True)
    for name in os.listdir(model_dir):
        if name != "model.safetensors" and os.path.isfile(os.path.join(model_dir, name)):
            shutil.copyfile(os.path.join(model_dir, name), os.path.join(out_dir, name))
    config_path = os.path.join(out_dir, "config.json")
    with open(config_path, encoding="utf-8") as f:
        config = json.load(f)
    config["torch_dtype"] = "float32"
    with open(config_path, "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    header, offset = {}, 0
    for name in sorted(tensors):
        _, shape, _ = tensors[name]
        size = 4 * (int(np.prod(shape)) if shape else 1)
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    tmp = os.path.join(out_dir, "model.safetensors.tmp")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for name in sorted(tensors):
            src_dtype, _, array = tensors[name]
            f.write(np.ascontiguousarray(to_f32(src_dtype, array)).tobytes())
    os.replace(tmp, os.path.join(out_dir, "model.safetensors"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="Tandem model directory")
    parser.add_argument("--out", help="GGUF file to write")
    parser.add_argument("--dtype", choices=["bf16", "f32"], default="bf16",
                        help="dtype of the 2-D weights in the GGUF file")
    parser.add_argument("--f32-model-dir", help="write a Tandem model dir with f32 weights instead")
    parser.add_argument("--gguf-py", help="llama.cpp's gguf-py directory (else from PYTHONPATH)")
    args = parser.parse_args()
    if args.gguf_py:
        sys.path.insert(0, args.gguf_py)
    if args.f32_model_dir:
        write_f32_model(args.model, args.f32_model_dir)
    elif args.out:
        convert(args.model, args.out, args.dtype)
    else:
        parser.error("one of --out or --f32-model-dir is required")


if __name__ == "__main__":
    main()
