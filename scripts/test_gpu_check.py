#!/usr/bin/env python3
"""Tests of gpu-check.sh's own logic, on a machine without a GPU.

The script runs here as it runs on a GPU machine with TANDEM_PREBUILT=1,
over a prebuilt folder of stand-ins: each gpu test binary writes what it
was asked to run (its filter and the TANDEM_CUDA_* settings) to a log and
passes, fails or hangs as the case says; tandem-bench writes its arguments
to the log and runs the real CPU tandem-bench (--device cpu, a short
prompt, the CUDA flags left out: their runs on a GPU are what the script
is for), whose --json is what the script reads; --bf16-gemm-configs rows
come from the case; tandem-model is the real one writing the small preset
for every preset asked. An ncu stand-in runs the program it profiles.
What is checked is what the script decides: which steps run with which
settings, which bf16 GEMM configuration the flash runs and the profile
take, what a failure leaves out and whether it fails the script.

Usage: test_gpu_check.py BIN-DIR (the CPU build's bin/)."""

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.abspath(sys.argv.pop(1)) if len(sys.argv) > 1 else os.path.join(ROOT, "build", "bin")

# A gpu test binary: logs "test NAME FILTER SETTINGS", then fails where
# DRY_FAIL matches that line, hangs where DRY_HANG does, else passes.
TEST_STAND_IN = r"""#!/usr/bin/env bash
filter="*"
for arg in "$@"; do [[ "${arg}" == --gtest_filter=* ]] && filter="${arg#--gtest_filter=}"; done
line="test $(basename "$0") ${filter} $(env | grep '^TANDEM_CUDA_' | sort | tr '\n' ' ')"
echo "${line}" >> "${DRY_LOG}"
if [[ -n "${DRY_HANG:-}" ]] && grep -qE -- "${DRY_HANG}" <<<"${line}"; then exec sleep 60; fi
if [[ -n "${DRY_FAIL:-}" ]] && grep -qE -- "${DRY_FAIL}" <<<"${line}"; then exit 1; fi
exit 0
"""

# tandem-bench: logs "bench ARGS"; fails where DRY_FAIL matches; runs the
# CPU bench once per batch size (cached in DRY_CACHE) and writes its JSON
# with the CUDA flags' fields; --deep-skinny runs report a decode step 0.9
# times the cached one, --compact-attention a prefill 1.25 times as fast;
# every run reports a logits copy back of 1.7 ms pageable, 0.4 page-locked,
# and a decode step with the logits on the host 1.5 times the greedy one;
# the logits digests are the CPU run's, another last step's in --deep-skinny
# runs where DRY_DEEP_DIGEST is set (a candidate that changed the bits).
BENCH_STAND_IN = r"""#!/usr/bin/env python3
import json, os, re, subprocess, sys
args = sys.argv[1:]
if "--help" in args:
    print("  --batch INT  sequences decoding together")
    sys.exit(0)
line = "bench " + " ".join(args)
with open(os.environ["DRY_LOG"], "a") as log:
    log.write(line + "\n")
if os.environ.get("DRY_FAIL") and re.search(os.environ["DRY_FAIL"], line):
    sys.exit(1)
value = lambda flag: args[args.index(flag) + 1] if flag in args else None
batch = value("--batch") or "1"
cached = os.path.join(os.environ["DRY_CACHE"], "batch" + batch + ".json")
if not os.path.exists(cached):
    command = [os.path.join(os.environ["DRY_BIN"], "tandem-bench"), "engine", "--device", "cpu",
               "--model", value("--model"), "--prompt-tokens", "16", "--decode-tokens", "2",
               "--repeats", "1", "--copy-mib", "8", "--profile-ops", "--batch", batch,
               "--json", cached]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
run = json.load(open(cached))
run.update({"logits_copy_pageable_ms": 1.7, "logits_copy_page_locked_ms": 0.4,
            "decode_step_host_logits_s": run["decode_step_s"] * 1.5})
if "--deep-skinny" in args:
    run["decode_step_s"] *= 0.9
    if os.environ.get("DRY_DEEP_DIGEST"):
        run["decode_logits_xxh3"] = "0123456789abcdef"
if "--compact-attention" in args:
    run["prefill_tokens_per_s"] *= 1.25
if "--bf16-gemm-configs" in args:
    run["bf16_gemm_configs"] = json.loads(os.environ["DRY_GEMM_ROWS"])
if value("--json"):
    json.dump(run, open(value("--json"), "w"))
"""

MODEL_STAND_IN = r"""#!/usr/bin/env bash
args=()
while (($#)); do
  case "$1" in
    --preset) args+=(--preset small); shift 2 ;;
    --layers) shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
exec "${DRY_BIN}/tandem-model" "${args[@]}"
"""

NCU_STAND_IN = r"""#!/usr/bin/env bash
if [[ "$1" == "--version" ]]; then
  echo "NVIDIA (R) Nsight Compute Command Line Profiler"
  exit 0
fi
if [[ "$1" == "--import" ]]; then echo '"ID","Kernel Name"'; exit 0; fi
report=""
while (($#)); do
  case "$1" in
    --export) report="$2"; shift 2 ;;
    env) break ;;
    *) shift ;;
  esac
done
echo "ncu ${report##*/}" >> "${DRY_LOG}"
"$@"
status=$?
touch "${report}.ncu-rep"
exit "${status}"
"""


# compute-sanitizer: logs "sanitizer TOOL PROGRAM FILTER small=SETTING" (the
# TANDEM_GPU_TEST_SMALL_SHAPES it was given), fails where DRY_FAIL matches
# that line, else runs the program.
SANITIZER_STAND_IN = r"""#!/usr/bin/env bash
tool=""
while (($#)); do
  case "$1" in
    --tool) tool="$2"; shift 2 ;;
    --error-exitcode) shift 2 ;;
    -*) shift ;;
    *) break ;;
  esac
done
filter="*"
for arg in "$@"; do [[ "${arg}" == --gtest_filter=* ]] && filter="${arg#--gtest_filter=}"; done
line="sanitizer ${tool} $(basename "$1") ${filter} small=${TANDEM_GPU_TEST_SMALL_SHAPES:-}"
echo "${line}" >> "${DRY_LOG}"
if [[ -n "${DRY_FAIL:-}" ]] && grep -qE -- "${DRY_FAIL}" <<<"${line}"; then exit 1; fi
exec "$@"
"""


def gemm_rows(layer_ms, differ=()):
    """--bf16-gemm-configs rows: configuration c takes layer_ms[c]."""
    return [{"config": c, "shape": "-", "layer_ms": ms, "tflops": 1.0,
             "speed_over_config0": layer_ms[0] / ms, "same_bits_as_config0": c not in differ}
            for c, ms in enumerate(layer_ms)]


# Configuration 1 fastest with configuration 0's bits, 9 faster still with
# other bits, 7 the fastest with the same bits from 6 on.
ROWS = gemm_rows([10.0, 5.0, 9.0, 9.0, 9.0, 9.0, 7.0, 6.0, 6.5, 4.0], differ=(9,))


def write(path, text):
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


class GpuCheckTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="gpu-check-test-")
        cls.cache = os.path.join(cls.dir, "cache")
        build = os.path.join(cls.dir, "build")
        for folder in (cls.cache, os.path.join(cls.dir, "path"),
                       *(os.path.join(build, sub) for sub in ("bin", "tests", "lib", "ucx"))):
            os.makedirs(folder)
        for name in ("gpu_instructions_test", "gpu_cuda_kernels_test",
                     "gpu_engine_exactness_test", "engine_backend_exactness_test"):
            write(os.path.join(build, "tests", name), TEST_STAND_IN)
        write(os.path.join(build, "bin", "tandem-bench"), BENCH_STAND_IN)
        write(os.path.join(build, "bin", "tandem-model"), MODEL_STAND_IN)
        write(os.path.join(cls.dir, "path", "ncu"), NCU_STAND_IN)
        write(os.path.join(cls.dir, "path", "compute-sanitizer"), SANITIZER_STAND_IN)
        cls.build = build

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def check(self, rows=ROWS, fail="", hang="", **settings):
        """Runs gpu-check.sh; returns (exit status, its output, the log)."""
        case = tempfile.mkdtemp(dir=self.dir)
        log = os.path.join(case, "log")
        open(log, "w").close()
        env = {key: value for key, value in os.environ.items()
               if not key.startswith(("TANDEM_", "DRY_"))}
        env.update({
            "PATH": os.path.join(self.dir, "path") + os.pathsep + env.get("PATH", ""),
            "DRY_LOG": log, "DRY_BIN": BIN, "DRY_CACHE": self.cache,
            "DRY_GEMM_ROWS": json.dumps(rows), "DRY_FAIL": fail, "DRY_HANG": hang,
            "TANDEM_PREBUILT": "1", "BENCH_REPEATS": "1", "F32_BENCH": "0", "UNORDERED": "0",
            "TORCH_COMPARE": "0", "STEP_TIMEOUT": "120", "WGMMA_TIMEOUT": "2",
            "BENCH_JSON_DIR": os.path.join(case, "json"), "PROFILE": "1",
        })
        env.update(settings)
        result = subprocess.run(
            ["bash", os.path.join(ROOT, "scripts", "gpu-check.sh"), self.build,
             os.path.join(case, "scratch")],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
        with open(log, encoding="utf-8") as f:
            lines = f.read().splitlines()
        return result.returncode, result.stdout, lines

    def check_one_model(self, expected_status, **case):
        """check() of the 8B shape's runs alone, without the profile; the
        script must exit with `expected_status`. Returns (output, log)."""
        case = {"SKIP_SMALL": "1", "PROFILE": "0", **case}
        status, out, lines = self.check(**case)
        self.assertEqual(status, expected_status, out)
        return out, lines

    def assertRan(self, lines, pattern, count=None):
        found = [line for line in lines if re.search(pattern, line)]
        if count is None:
            self.assertTrue(found, f"nothing ran matching {pattern!r}:\n" + "\n".join(lines))
        else:
            self.assertEqual(len(found), count, f"{pattern!r}:\n" + "\n".join(lines))
        return found

    def test_everything_passing_runs_every_step_with_its_settings(self):
        status, out, lines = self.check(SKIP_SMALL="0")
        self.assertEqual(status, 0, out)
        # The candidates' checks: their kernel tests, then the engine's
        # exactness checks with all of them on.
        self.assertRan(lines, r"^test gpu_cuda_kernels_test \*Candidate\* ", 1)
        self.assertRan(lines, r"^test gpu_engine_exactness_test \S*CudaExactnessTest\S* "
                       r".*TANDEM_CUDA_CANDIDATES=1 .*TANDEM_CUDA_KERNELS=flash", 1)
        self.assertRan(lines, r"^test engine_backend_exactness_test \*cuda\* "
                       r".*TANDEM_CUDA_CANDIDATES=1", 1)
        # Reference kernels first, with nothing set.
        self.assertRegex(lines[0], r"^test gpu_instructions_test -CudaFastKernelsTest\S* $")
        for model in ("small", "llama3-8b"):
            # The bf16 GEMM configurations timed once per model, at batch 1.
            self.assertRan(lines, rf"^bench .*/{model} .*--bf16-gemm-configs", 1)
            # Both flash runs of each batch take configuration 1, the fastest
            # with configuration 0's bits (9 is faster, with other bits).
            flash = self.assertRan(lines, rf"^bench .*/{model} .*--cuda-kernels flash", 4)
            for line in flash:
                self.assertTrue(line.endswith("--bf16-gemm-config 1") or
                                "--bf16-gemm-config 1 " in line, line)
            self.assertRan(lines, rf"^bench .*/{model} .*--deep-skinny --compact-attention "
                           r"--deep-attention", 2)
            for batch in (1, 32):
                self.assertIn(f"== deep decode and attention loads, {model} batch {batch}: "
                              "decode step", out)
                self.assertRegex(out, rf"deep decode and attention loads, {model} batch {batch}:"
                                 r" .* ms deep: 1\.111\n")
                self.assertRegex(out, rf"compact attention grid, {model} batch {batch}: .*: "
                                 r"1\.250\n")
                self.assertRegex(out, rf"\n== candidates' logits, {model} batch {batch}: prompt "
                                 r"[0-9a-f]{16}, last decode step [0-9a-f]{16}: equal to the "
                                 r"serving run's\n")
            self.assertIn(f"== goals: {model}", out)
            for batch in (1, 32):
                self.assertIn(f"== logits copy back, {model} batch {batch}: 1.700 ms into "
                              "pageable memory, 0.400 ms page-locked (4.250)\n", out)
                self.assertRegex(out, rf"== decode step with the logits on the host \(sampled "
                                 rf"requests\), {model} batch {batch}: .* \(1\.500\)\n")
                self.assertRegex(out, rf"== a step's rows sampled on the host \(T 0\.6, top-p "
                                 rf"0\.9\), {model} batch {batch}: [0-9.]+ ms on the kernels' "
                                 r"threads, [0-9.]+ on one \([0-9.]+\); [0-9.]+ of the greedy "
                                 r"step\n")
        self.assertIn("flash, bf16 compute, fused projections, deep decode and attention loads",
                      out)
        # The profile: the serving flags with configuration 1, the
        # candidates' with 7 (the fastest with the same bits from 6 on).
        profiled = self.assertRan(lines, r"^bench .*--decode-tokens 2 ", 4)
        self.assertEqual([" --deep-skinny" in line for line in profiled],
                         [False, False, True, True])
        self.assertEqual([re.search(r"--bf16-gemm-config (\d)", line).group(1)
                          for line in profiled], ["1", "1", "7", "7"])
        self.assertEqual([line for line in lines if line.startswith("ncu ")],
                         ["ncu ncu-batch1", "ncu ncu-batch32", "ncu ncu-batch1-candidates",
                          "ncu ncu-batch32-candidates"])
        self.assertNotIn("FAILED", out)
        # Every bench run and test binary says how long it took.
        benches = [line for line in lines if line.startswith("bench ")]
        self.assertEqual(len(re.findall(r"^-- tandem-bench: \d+ s, exit 0 \(\d+ s into the "
                                        r"check\)$", out, re.M)), len(benches) - 4, out)
        self.assertEqual(len(re.findall(r"^-- env: \d+ s, exit 0 ", out, re.M)), 4, out)
        self.assertEqual(len(re.findall(r"^-- gpu_\w+_test: \d+ s, exit 0 ", out, re.M)),
                         len([line for line in lines if line.startswith("test gpu_")]), out)
        self.assertRegex(out, r"\n== the check took \d+ s\n")

    def test_a_failing_candidate_leaves_its_runs_out_and_fails_nothing_that_serves(self):
        # Configuration 8, the fastest with configuration 0's bits, is a
        # candidate: the flash runs take 1, the fastest of the others.
        rows = gemm_rows([10.0, 5.0, 9.0, 9.0, 9.0, 9.0, 7.0, 6.0, 3.0, 4.0])
        out, lines = self.check_one_model(0, fail=r"^test gpu_cuda_kernels_test \*Candidate\*",
                                          PROFILE="1", rows=rows)
        self.assertRan(lines, r"^bench .*--cuda-kernels flash .*--bf16-gemm-config 1", 4)
        self.assertRan(lines, r"^bench .*--deep-skinny", 0)
        self.assertRan(lines, r"^bench .*--decode-tokens 64 .*--cuda-kernels flash", 2)
        self.assertIn("== the candidates' benchmark run left out", out)
        self.assertIn("== candidates (deep decode and attention loads, compact attention grid; "
                      "no serving path): a kernel test or their benchmark run FAILED", out)
        self.assertNotIn(", deep decode and attention loads, compact attention grid |", out)
        # Nor are they profiled: the serving runs are.
        self.assertEqual([line for line in lines if line.startswith("ncu ")],
                         ["ncu ncu-batch1", "ncu ncu-batch32"])
        self.assertIn("== ncu: batch1-candidates left out", out)

    def test_a_failing_candidate_run_fails_only_the_candidates(self):
        out, lines = self.check_one_model(0, fail=r"^bench .*--deep-skinny")
        self.assertIn("a kernel test or their benchmark run FAILED", out)
        # Batch 1's run failed: batch 32's is not tried (a kernel that faults
        # costs one step of the GPU window, not two).
        self.assertRan(lines, r"^bench .*--deep-skinny", 1)
        self.assertIn("== the candidates' benchmark run left out", out)
        self.assertRan(lines, r"^bench .*--batch 32 .*--cuda-kernels flash", 1)

    def test_candidates_whose_logits_differ_fail_and_are_counted_out(self):
        out, lines = self.check_one_model(0, PROFILE="1", DRY_DEEP_DIGEST="1")
        for batch in (1, 32):
            self.assertRegex(out, rf"\n== candidates' logits, llama3-8b batch {batch}: prompt "
                             r"[0-9a-f]{16}, last decode step 0123456789abcdef: DIFFER from the "
                             r"serving run's \([0-9a-f]{16}, [0-9a-f]{16}\)\n")
        self.assertIn("a kernel test or their benchmark run FAILED, or their logits differ from "
                      "the serving run's", out)
        # Neither profiled nor counted for the goals; the serving runs are.
        self.assertEqual([line for line in lines if line.startswith("ncu ")],
                         ["ncu ncu-batch1", "ncu ncu-batch32"])
        self.assertNotIn(", deep decode and attention loads, compact attention grid |", out)
        self.assertIn("| flash, bf16 compute, fused projections |", out)

    def test_sanitize_runs_each_tool_and_a_hazard_fails_only_the_kernels_it_was_in(self):
        out, lines = self.check_one_model(
            0, SANITIZE="1", fail=r"^sanitizer racecheck \S+ \*Candidate\* ")
        self.assertRan(lines, r"^sanitizer memcheck gpu_cuda_kernels_test "
                              r"CudaFastKernelsTest\*:-\*Candidate\* small=$", 1)
        # racecheck and synccheck at the emulator's shapes, on the candidates'
        # tests and on the wgmma rows, each apart.
        for tool in ("racecheck", "synccheck"):
            for tests in (r"\*Candidate\*", r"\*Bf16WgmmaRows\*"):
                self.assertRan(lines, rf"^sanitizer {tool} gpu_cuda_kernels_test {tests} small=1$",
                               1)
        self.assertIn("their logits differ from the serving run's, or compute-sanitizer found a "
                      "hazard", out)
        self.assertRan(lines, r"^bench .*--deep-skinny", 0)
        self.assertNotIn("== wgmma (", out)
        self.assertRan(lines, r"^bench .*--batch 32 .*--cuda-kernels flash", 1)

    def test_a_hazard_in_the_wgmma_rows_fails_the_wgmma_configurations_alone(self):
        rows = gemm_rows([10.0, 5.0, 9.0, 9.0, 9.0, 9.0, 2.0, 6.0, 3.0, 4.0], differ=(9,))
        out, lines = self.check_one_model(
            0, SANITIZE="1", rows=rows, fail=r"^sanitizer synccheck \S+ \*Bf16WgmmaRows\* ")
        self.assertIn("a probe failed, the rows differ from configuration 0's or "
                      "compute-sanitizer found a hazard", out)
        self.assertNotIn("compute-sanitizer found a hazard (see above)\n== candidates", out)
        self.assertNotIn("== candidates (deep decode", out)
        # The flash runs leave configuration 6 out: 8 is the fastest of the others.
        self.assertRan(lines, r"^bench .*--cuda-kernels flash .*--bf16-gemm-config 8", 4)

    def test_after_a_hanging_wgmma_step_the_sanitizer_leaves_the_wgmma_rows_out(self):
        out, lines = self.check_one_model(0, SANITIZE="1", hang=r"^test \S+ \*Warpgroup\*")
        self.assertRan(lines, r"^sanitizer \S+ \S+ \*Bf16WgmmaRows\*", 0)
        self.assertRan(lines, r"^sanitizer (racecheck|synccheck) \S+ \*Candidate\* small=1$", 2)
        self.assertIn("== compute-sanitizer racecheck: the wgmma rows left out (the wgmma step "
                      "hung)", out)

    def test_a_failing_flash_check_fails_the_script(self):
        out, lines = self.check_one_model(
            1, fail=r"^test gpu_engine_exactness_test \S*CudaExactnessTest\S* "
                    r"TANDEM_CUDA_COMPUTE_DTYPE=bf16 TANDEM_CUDA_KERNELS=flash $")
        self.assertIn("== --cuda-kernels flash: a test or benchmark run FAILED", out)
        # The figures still come, and the flash family does not count.
        self.assertRan(lines, r"^bench .*--cuda-kernels flash", 4)
        self.assertNotIn("| flash, bf16 compute, fused projections |", out)

    def test_a_failing_reference_test_fails_the_script(self):
        out, _ = self.check_one_model(1, fail=r"^test gpu_cuda_kernels_test -CudaFastKernelsTest",
                                      FAST="0")
        self.assertIn("== reference kernels: a gpu test or benchmark run FAILED", out)

    def test_a_hanging_wgmma_step_keeps_the_configurations_out_of_the_timing(self):
        out, lines = self.check_one_model(0, hang=r"^test \S+ \*Warpgroup\*")
        self.assertIn("== bf16 GEMM configurations not timed: the wgmma step hung", out)
        self.assertRegex(out, r"\n-- gpu_instructions_test: [23] s, exit 124 ")
        self.assertRan(lines, r"--bf16-gemm-configs", 0)
        # The flash runs take the serving configuration (no flag).
        self.assertRan(lines, r"^bench .*--bf16-gemm-config ", 0)
        self.assertIn("== wgmma (bf16 GEMM configurations 4 to 7; no serving path): a probe "
                      "failed", out)

    def test_a_failing_wgmma_step_keeps_its_configurations_out_of_the_flash_runs(self):
        # Configuration 6 is the fastest with configuration 0's bits at the
        # 8B shape, but a wgmma probe or row test failed: the flash runs take
        # 8, the fastest of the others; the configurations are still timed.
        rows = gemm_rows([10.0, 5.0, 9.0, 9.0, 9.0, 9.0, 2.0, 6.0, 3.0, 4.0], differ=(9,))
        out, lines = self.check_one_model(0, fail=r"^test gpu_instructions_test \*Warpgroup\*",
                                          rows=rows)
        self.assertIn("== wgmma (bf16 GEMM configurations 4 to 7; no serving path): a probe "
                      "failed", out)
        self.assertRan(lines, r"--bf16-gemm-configs", 1)
        self.assertRan(lines, r"^bench .*--cuda-kernels flash .*--bf16-gemm-config 8", 4)

    def test_a_spent_budget_leaves_the_profile_out_and_the_check_ends_on_its_summary(self):
        # Every ncu run could take PROFILE_TIMEOUT, past the budget's end
        # (not yet reached): none starts; everything before the profile ran.
        out, lines = self.check_one_model(0, PROFILE="1", PROFILE_TIMEOUT="90000",
                                          CHECK_BUDGET="50000")
        self.assertRan(lines, r"^ncu ", 0)
        self.assertRan(lines, r"^bench .*--decode-tokens 2 ", 0)
        for run in ("batch1", "batch32", "batch1-candidates", "batch32-candidates"):
            self.assertRegex(out, rf"\n== ncu: {run} left out: it could end past "
                             r"CHECK_BUDGET=50000 s \(\d+ s into the check\)\n")
        self.assertRan(lines, r"^bench .*--decode-tokens 64 .*--cuda-kernels flash", 4)
        self.assertIn("== goals: llama3-8b", out)
        self.assertRegex(out, r"\n== the check took \d+ s \(CHECK_BUDGET=50000 s\)\n")

    def test_no_configuration_with_the_same_bits_leaves_the_serving_one(self):
        rows = gemm_rows([10.0] * 10, differ=range(1, 10))
        rows[0]["same_bits_as_config0"] = True
        out, lines = self.check_one_model(0, rows=rows, PROFILE="1")
        # Configuration 0 itself qualifies for the flash runs; from 6 on none
        # does, so the candidates' profile takes the serving one (no flag).
        self.assertRan(lines, r"^bench .*/llama3-8b .*--cuda-kernels flash .*--bf16-gemm-config 0",
                       4)
        profiled = self.assertRan(lines, r"^bench .*--decode-tokens 2 .*--deep-skinny", 2)
        for line in profiled:
            self.assertNotIn("--bf16-gemm-config", line)


if __name__ == "__main__":
    unittest.main()
