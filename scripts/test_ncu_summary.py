#!/usr/bin/env python3
"""Tests of ncu_summary.py on raw pages laid out as `ncu --csv --page raw`
writes them (a header row, a units row, a row per launch): standard
library only."""

import csv
import io
import os
import sys
import tempfile
import unittest
from contextlib import redirect_stdout

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True  # no __pycache__ in the source tree

import ncu_summary as ns  # noqa: E402

HEADER = ["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream",
          "Block Size", "Grid Size", "Device", "CC",
          "dram__bytes.sum", "gpu__time_duration.sum", "lts__t_bytes.sum",
          "dram__throughput.avg.pct_of_peak_sustained_elapsed",
          "launch__registers_per_thread", "launch__grid_size",
          "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",
          "smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio",
          "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio",
          "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio"]
UNITS = [""] * 11 + ["byte", "nsecond", "byte", "%", "register/thread", "", "", "", "", ""]
SKINNY = ["0", "42", "tandem-bench", "127.0.0.1",
          "void tandem::kernels::cuda::(anonymous namespace)::skinny::bf16MmaSkinnyKernel<4, 2>"
          "(const uint4 *, long, long, const uint4 *, long, "
          "tandem::kernels::cuda::MatmulEpilogue)",
          "1", "7", "(128, 1, 1)", "(128, 1, 1)", "0", "9.0",
          "117,440,512", "141,000", "587,202,560", "20.5", "128", "128",
          "9.5", "1.25", "0", "2.5"]


class SummaryTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)

    def write(self, rows):
        path = os.path.join(self.dir.name, "raw.csv")
        with open(path, "w", newline="", encoding="utf-8") as f:
            csv.writer(f, quoting=csv.QUOTE_ALL).writerows(rows)
        return path

    def test_a_launch_reads_in_base_units_with_its_largest_stalls(self):
        [launch] = ns.read(self.write([HEADER, UNITS, SKINNY]))
        self.assertEqual(launch["kernel"], "bf16MmaSkinnyKernel<4, 2>")
        self.assertAlmostEqual(launch["seconds"], 141e-6)
        self.assertEqual(launch["dram_bytes"], 117440512.0)
        self.assertEqual(launch["registers"], 128.0)
        self.assertIsNone(launch["l1_pct"])  # not in this report
        self.assertEqual([s["reason"] for s in launch["stalls"]],
                         ["long_scoreboard", "wait", "math_pipe_throttle"])
        text = ns.render([launch])
        row = text.splitlines()[1]
        # 117,440,512 bytes in 141 us: 833 GB/s; L2 moved 5.00 bytes per DRAM byte.
        self.assertIn(" 833 ", row)
        self.assertIn("5.00", row)
        self.assertIn("long_scoreboard 9.5, wait 2.5, math_pipe_throttle 1.2", row)

    def test_units_scale_and_a_report_without_a_units_row_reads(self):
        units = list(UNITS)
        units[HEADER.index("gpu__time_duration.sum")] = "usecond"
        units[HEADER.index("dram__bytes.sum")] = "Mbyte"
        row = list(SKINNY)
        row[HEADER.index("gpu__time_duration.sum")] = "141"
        row[HEADER.index("dram__bytes.sum")] = "117.44"
        [scaled] = ns.read(self.write([HEADER, units, row]))
        self.assertAlmostEqual(scaled["seconds"], 141e-6)
        self.assertAlmostEqual(scaled["dram_bytes"], 117.44e6)
        launches = ns.read(self.write([HEADER, SKINNY, SKINNY]))
        self.assertEqual(len(launches), 2)
        self.assertAlmostEqual(launches[1]["seconds"], 141e-9 * 1000)

    def test_short_units_the_sol_dram_name_and_lines_before_the_header(self):
        header = list(HEADER)
        header[HEADER.index("dram__throughput.avg.pct_of_peak_sustained_elapsed")] = \
            "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"
        units = list(UNITS)
        units[HEADER.index("gpu__time_duration.sum")] = "us"
        row = list(SKINNY)
        row[HEADER.index("gpu__time_duration.sum")] = "141"
        [launch] = ns.read(self.write([["==PROF== Disconnected"], header, units, row]))
        self.assertAlmostEqual(launch["seconds"], 141e-6)
        self.assertEqual(launch["dram_pct"], 20.5)
        units[HEADER.index("gpu__time_duration.sum")] = "ns"
        row[HEADER.index("gpu__time_duration.sum")] = "141,000"
        [launch] = ns.read(self.write([header, units, row]))
        self.assertAlmostEqual(launch["seconds"], 141e-6)

    def test_short_names(self):
        self.assertEqual(ns.short_name("void a::(anonymous namespace)::k<128, 1, true>(int *)"),
                         "k<128, 1, true>")
        self.assertEqual(ns.short_name("attentionFlashKernel"), "attentionFlashKernel")
        self.assertEqual(ns.short_name("void f::g(float, int)"), "g")
        self.assertEqual(ns.short_name("void a::<unnamed>::k<4, 2>(int)"), "k<4, 2>")

    def test_an_empty_report_fails_with_a_message(self):
        out = io.StringIO()
        with redirect_stdout(out):
            code = ns.main([self.write([HEADER, UNITS])])
        self.assertEqual(code, 1)
        self.assertIn("no kernel launches", out.getvalue())


if __name__ == "__main__":
    unittest.main()
