#!/usr/bin/env python3
"""The float64 reference forward pass of llama_cpp_compare.py against a live agent.

  test_reference_forward.py BIN_DIR

For the tiny Llama, Gemma 2, Gemma 3, Phi-3 (partial rotary dims, LongRoPE's
long factors and, served 128 tokens, its short ones, a window on every layer),
Mistral given a 24-token window, Ministral 3 (YaRN, its query scale from
position 32 on), Qwen3 with YaRN (as tandem-model writes it,
and on Llama with every YaRN option set otherwise), SmolLM3 (its second
layer without RoPE; every layer without it, by interval), Granite, OLMo 2,
OLMo 3 (a sliding layer rotating unscaled, YaRN on the full one), Gemma 3
with YaRN on its full layers, GLM and GLM-4 (half of each head rotating as
neighbour pairs, q/k/v biases; GLM-4's sandwich norms), Mixtral, Qwen3-MoE,
Qwen2-MoE (a shared expert weighed by its sigmoid gate, every second layer a
mixture) and
GLM-4.5 (sigmoid routing with a correction bias in groups, a routed scale, a
shared expert, a dense first layer, q/k norms) and GPT-OSS (sinks, biased
router and experts with the clamped activation; bf16 experts as
transformers holds them and MXFP4 as published) and Granite MoE (Granite's
scalars, stacked experts, softmax over the chosen logits) and OLMoE (q/k
norms across the heads, 3 of 8 experts on every layer, not renormalized)
test models, Gemma 3
and Mistral rewritten as Gemma 3 4B and up and Mistral Small 3.1 are
published (Gemma3ForConditionalGeneration, Mistral3ForConditionalGeneration:
a nested config, prefixed tensors, a vision tower to pass by), and fp8 Llama, Qwen3-MoE and Mixtral ones
(per-channel scales; blocks splitting rows and columns; 128 x 128 blocks,
wider than the tiny matrices' rows)
(tandem-model, into a temporary directory), starts `tandem-agent serve` with an f32 KV cache and
compares the ten largest log-probabilities of the next token of three
prompts with the reference's, which is written from transformers' modeling
(numpy, float64), apart from the engine and its C++ reference. Fails when the
error exceeds 1e-4 of the largest reference logit (f32 arithmetic gives about
1e-6), when the greedy token differs, or when a mixture's routing was a near
tie the engine's rounding could break. Needs numpy: re-runs itself with a
python3 that has it (make deps installs python3-numpy for /usr/bin/python3).
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True  # no __pycache__ in the source tree

import numpy_python  # noqa: E402

numpy_python.ensure_numpy("test_reference_forward")
import numpy as np  # noqa: E402

import llama_cpp_compare as lcc  # noqa: E402

ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                 "ministral3": "Ministral3ForCausalLM",
                 "mixtral": "MixtralForCausalLM",
                 "qwen3_moe": "Qwen3MoeForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM",
                 "gemma3": "Gemma3ForCausalLM",
                 "gemma2": "Gemma2ForCausalLM", "phi3": "Phi3ForCausalLM",
                 "granite": "GraniteForCausalLM", "olmo2": "Olmo2ForCausalLM",
                 "olmo3": "Olmo3ForCausalLM",
                 "qwen3": "Qwen3ForCausalLM", "smollm3": "SmolLM3ForCausalLM",
                 "glm": "GlmForCausalLM", "glm4": "Glm4ForCausalLM",
                 "glm4_moe": "Glm4MoeForCausalLM", "gpt_oss": "GptOssForCausalLM",
                 "granitemoe": "GraniteMoeForCausalLM", "olmoe": "OlmoeForCausalLM"}
# config.json edits a "config=NAME" case applies: YaRN with each option off
# its default (bounds not rounded, DeepSeek's mscale pair, a context 8 times
# an original of 128, so the agent serves 1024 positions).
CONFIG_EDITS = {"yarn-options": {"rope_scaling": {
    "rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 128,
    "beta_fast": 4, "beta_slow": 0.5, "truncate": False, "mscale": 2, "mscale_all_dim": 1}},
    # SmolLM3 with no no_rope_layers: every no_rope_layer_interval-th layer
    # (here the first of two) goes without RoPE.
    "nope-interval": {"no_rope_layers": None, "no_rope_layer_interval": 1}}
# (architecture, tandem-model --quantize or None; "vision-checkpoint": the
# model rewritten as Gemma 3 4B and up or Mistral Small 3.1 are published, see
# as_vision_checkpoint;
# "max-model-len=N": the agent serves N tokens (Phi-3's LongRoPE then takes
# its short factors); "sliding-window=N": config.json given that window;
# "rope-scaling=yarn": tandem-model --rope-scaling yarn; "config=NAME":
# config.json edited by CONFIG_EDITS[NAME])
CASES = [("llama", None), ("gemma2", None), ("gemma3", None), ("gemma3", "vision-checkpoint"),
         ("gemma3", "vision-checkpoint:model.language_model."), ("phi3", None),
         ("phi3", "max-model-len=128"), ("mistral", "sliding-window=24"),
         ("mistral", "vision-checkpoint"), ("mistral", "vision-checkpoint:model.language_model."),
         ("ministral3", None),
         ("qwen3", "rope-scaling=yarn"), ("llama", "config=yarn-options"), ("smollm3", None),
         ("smollm3", "config=nope-interval"), ("granite", None),
         ("olmo2", None), ("olmo3", None), ("gemma3", "config=yarn-options"),
         ("glm", None), ("glm4", None),
         ("mixtral", None),
         ("qwen3_moe", None), ("qwen2_moe", None), ("glm4_moe", None), ("gpt_oss", None),
         ("gpt_oss", "mxfp4"), ("granitemoe", None), ("olmoe", None),
         ("llama", "compressed-tensors:channel"), ("qwen3_moe", "fp8:block=16x32"),
         ("mixtral", "fp8")]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def completion(port, prompt):
    body = {"model": "m", "prompt": prompt, "max_tokens": 1, "temperature": 0, "logprobs": 20,
            "return_token_ids": True}
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions",
                                     data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())["choices"][0]


class RoutingWatch(lcc.Reference):
    """The reference, noting the narrowest gap between a token's last chosen
    and first unchosen router logit."""

    narrowest = float("inf")

    def mlp(self, h, p, i):
        if self.is_moe_layer(i):
            self.narrowest = min(self.narrowest, self.route(h, p)[2])
        return super().mlp(h, p, i)


# The architecture a causal model's vision checkpoint names, its model_type,
# and a vision tensor of its tower.
VISION_CHECKPOINTS = {
    "Gemma3ForCausalLM": ("Gemma3ForConditionalGeneration", "gemma3",
                          "vision_tower.vision_model.embeddings.patch_embedding.weight"),
    "MistralForCausalLM": ("Mistral3ForConditionalGeneration", "mistral3",
                           "vision_tower.patch_conv.weight")}


def as_vision_checkpoint(model, out, prefix):
    """The Gemma3ForCausalLM or MistralForCausalLM directory `model`
    rewritten as Gemma 3 4B and up and Mistral Small 3.1 are published
    (Gemma3ForConditionalGeneration, Mistral3ForConditionalGeneration):
    config.json's fields under text_config beside a vision_config, the
    language model's tensors under `prefix` (language_model.model. as
    published, model.language_model. as newer transformers save them)
    instead of model., an untied lm_head under language_model. with the
    former, and vision tensors the agent must pass by."""
    os.makedirs(out)
    for name in os.listdir(model):
        if name not in ("config.json", "model.safetensors"):
            shutil.copy(os.path.join(model, name), out)
    text = lcc.load(os.path.join(model, "config.json"))
    architecture, model_type, vision_name = VISION_CHECKPOINTS[text["architectures"][0]]
    top = {"architectures": [architecture], "model_type": model_type,
           "torch_dtype": text.pop("torch_dtype"), "eos_token_id": text.pop("eos_token_id"),
           "vision_config": {"hidden_size": 4}}
    del text["architectures"]
    top["text_config"] = text
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(top, f)
    with open(os.path.join(model, "model.safetensors"), "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
        data = f.read()
    renamed = {}
    for name, info in header.items():
        if name == "lm_head.weight" and prefix == "language_model.model.":
            renamed["language_model.lm_head.weight"] = info
        elif name.startswith("model."):
            renamed[prefix + name[len("model."):]] = info
        elif name != "__metadata__":
            renamed[name] = info
    vision = np.arange(16, dtype=np.float32).tobytes()
    renamed[vision_name] = {
        "dtype": "F32", "shape": [4, 4], "data_offsets": [len(data), len(data) + len(vision)]}
    text_header = json.dumps(renamed).encode()
    text_header += b" " * (-len(text_header) % 8)
    with open(os.path.join(out, "model.safetensors"), "wb") as f:
        f.write(len(text_header).to_bytes(8, "little"))
        f.write(text_header)
        f.write(data + vision)


def check(bin_dir, work, arch, quantize):
    label = arch + (f" {quantize}" if quantize else "")
    model = os.path.join(work, label.replace(" ", "-").replace(":", "-").replace("=", "-"))
    vision = bool(quantize) and quantize.startswith("vision-checkpoint")
    max_model_len = None
    edits = {}
    extra = []
    if quantize and quantize.startswith("max-model-len="):
        max_model_len = int(quantize.partition("=")[2])
    elif quantize and quantize.startswith("sliding-window="):
        edits = {"sliding_window": int(quantize.partition("=")[2])}
    elif quantize and quantize.startswith("config="):
        edits = CONFIG_EDITS[quantize.partition("=")[2]]
    elif quantize and quantize.startswith("rope-scaling="):
        extra = ["--rope-scaling", quantize.partition("=")[2]]
    elif quantize and not vision:
        extra = ["--quantize", quantize]
    subprocess.run([os.path.join(bin_dir, "tandem-model"), "--preset", "tiny", "--arch", arch,
                    "--seed", "4", "--out", model] + extra, check=True, capture_output=True)
    config = lcc.load(os.path.join(model, "config.json"))
    if edits:
        config.update(edits)
        with open(os.path.join(model, "config.json"), "w") as f:
            json.dump(config, f)
    assert config["architectures"] == [ARCHITECTURES[arch]], config["architectures"]
    assert ("quantization_config" in config) == (extra[:1] == ["--quantize"])
    if "yarn" in (quantize or ""):
        assert config["rope_scaling"]["rope_type"] == "yarn", config["rope_scaling"]
    reference_dir = model
    if vision:
        model = model + "-served"
        as_vision_checkpoint(reference_dir, model,
                             quantize.partition(":")[2] or "language_model.model.")
    arch = label
    port = free_port()
    log = open(model + ".log", "w")
    agent = subprocess.Popen([os.path.join(bin_dir, "tandem-agent"), "serve", "--model", model,
                              "--port", str(port), "--served-model-name", "m", "--kv-dtype",
                              "f32", "--kv-cache-memory", "16MiB"] +
                             (["--max-model-len", str(max_model_len)] if max_model_len else []),
                             stdout=log,
                             stderr=subprocess.STDOUT)
    failures = []
    try:
        deadline = time.time() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5)
                break
            except OSError:
                if agent.poll() is not None or time.time() > deadline:
                    return [f"{arch}: the agent did not start (log {log.name})"]
                time.sleep(0.2)
        reference = RoutingWatch(reference_dir, max_model_len)
        vocab = len(lcc.load(os.path.join(model, "tokenizer.json"))["model"]["vocab"])
        rng = np.random.default_rng(8)
        for length in (5, 40, 130 if not max_model_len else max_model_len - 8):
            prompt = [int(t) for t in rng.integers(0, vocab, size=length)]
            choice = completion(port, prompt)
            logits = reference.last_logits(prompt)
            expected = np.sort(lcc.log_softmax(logits))[::-1][:10]
            served = np.array(sorted(choice["logprobs"]["top_logprobs"][0].values(),
                                     reverse=True)[:10])
            error = float(np.max(np.abs(served - expected))) / float(np.abs(logits).max())
            print(f"{arch}, {length}-token prompt: token {choice['token_ids'][0]} (reference "
                  f"{int(np.argmax(logits))}), top-10 log-prob error {error:.2e} of the largest "
                  f"logit")
            if choice["token_ids"][0] != int(np.argmax(logits)):
                failures.append(f"{arch}, {length} tokens: greedy token differs")
            if not error < 1e-4:
                failures.append(f"{arch}, {length} tokens: error {error:.2e} over 1e-4")
        if reference.experts and not reference.narrowest > 1e-4:
            failures.append(f"{arch}: a routing near tie ({reference.narrowest:.2e}): choose "
                            "another seed")
    finally:
        agent.terminate()
        agent.wait(timeout=30)
        log.close()
    return failures


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__.split("\n\n")[1])
    work = tempfile.mkdtemp(prefix="tandem-reference-forward-")
    try:
        failures = []
        for arch, quantize in CASES:
            failures += check(sys.argv[1], work, arch, quantize)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for failure in failures:
        print("FAIL:", failure)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
