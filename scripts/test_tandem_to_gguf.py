#!/usr/bin/env python3
"""Tests of tandem-to-gguf.py's parts that need no gguf-py: numpy only."""

import importlib.util
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True  # no __pycache__ in the source tree

import numpy_python  # noqa: E402

numpy_python.ensure_numpy("test_tandem_to_gguf")
import numpy as np  # noqa: E402
_SPEC = importlib.util.spec_from_file_location(
    "tandem_to_gguf", os.path.join(os.path.dirname(os.path.abspath(__file__)), "tandem-to-gguf.py"))
t2g = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(t2g)

# FP4 E2M1 (OCP Microscaling Formats v1.0): sign, 2 exponent bits, 1 mantissa bit.
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
# ggml's kvalues_mxfp4: E2M1 doubled, read with half the block's power of two.
GGML_KVALUES = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12]


def published_values(blocks, scales):
    """The matrix as the checkpoint defines it: element 2j of a block in byte
    j's low nibble, 2j + 1 in its high one, times 2^(scale - 127)."""
    rows, nblocks = scales.shape
    out = np.zeros((rows, nblocks * 32))
    for r in range(rows):
        for b in range(nblocks):
            for j in range(16):
                byte = int(blocks[r, b, j])
                scale = 2.0 ** (int(scales[r, b]) - 127)
                out[r, b * 32 + 2 * j] = E2M1[byte & 15] * scale
                out[r, b * 32 + 2 * j + 1] = E2M1[byte >> 4] * scale
    return out


def ggml_values(rows_bytes, nblocks):
    """ggml's dequantize_row_mxfp4 on block_mxfp4 rows: the exponent byte e,
    then qs[16]; y[j] = kvalues[qs[j] & 15] * 2^(e - 128), y[j + 16] the high
    nibble's."""
    rows = rows_bytes.shape[0]
    out = np.zeros((rows, nblocks * 32))
    for r in range(rows):
        for b in range(nblocks):
            block = rows_bytes[r, b * 17:(b + 1) * 17]
            d = 2.0 ** (int(block[0]) - 128)
            for j in range(16):
                out[r, b * 32 + j] = GGML_KVALUES[int(block[1 + j]) & 15] * d
                out[r, b * 32 + j + 16] = GGML_KVALUES[int(block[1 + j]) >> 4] * d
    return out


class GgmlMxfp4Test(unittest.TestCase):
    def test_every_nibble_keeps_its_value_and_place(self):
        rng = np.random.default_rng(5)
        rows, nblocks = 6, 3
        blocks = rng.integers(0, 256, size=(rows, nblocks, 16), dtype=np.uint8)
        blocks[0, 0, :] = np.arange(16, dtype=np.uint8) * 17  # every nibble, both halves
        scales = rng.integers(100, 150, size=(rows, nblocks), dtype=np.uint8)
        scales[1, 0] = 127
        packed = t2g.ggml_mxfp4(blocks, scales)
        self.assertEqual(packed.dtype, np.uint8)
        self.assertEqual(packed.shape, (rows, nblocks * 17))
        np.testing.assert_array_equal(ggml_values(packed, nblocks),
                                      published_values(blocks, scales))

    def test_leading_dimensions_and_strided_views_are_kept(self):
        # Experts first, gate the even rows of gate_up: the converter packs
        # strided views of the published tensor.
        rng = np.random.default_rng(6)
        experts, rows, nblocks = 2, 4, 2
        blocks = rng.integers(0, 256, size=(experts, rows, nblocks, 16), dtype=np.uint8)
        scales = rng.integers(110, 140, size=(experts, rows, nblocks), dtype=np.uint8)
        packed = t2g.ggml_mxfp4(blocks[:, 0::2], scales[:, 0::2])
        self.assertEqual(packed.shape, (experts, rows // 2, nblocks * 17))
        for e in range(experts):
            np.testing.assert_array_equal(ggml_values(packed[e], nblocks),
                                          published_values(blocks[e, 0::2], scales[e, 0::2]))


if __name__ == "__main__":
    unittest.main()
