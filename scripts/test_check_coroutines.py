#!/usr/bin/env python3
"""Tests of check_coroutines.py, then the check itself over the sources."""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True  # no __pycache__ in the source tree

import check_coroutines as cc  # noqa: E402


class FindingsTest(unittest.TestCase):
    def test_an_await_in_a_condition_is_found_on_its_line(self):
        text = ("awaitable<void> endStream(HttpExchange& exchange) {\n"
                "  if (co_await exchange.writeChunk(done))\n"
                "    co_await exchange.finishChunked();\n"
                "}\n")
        self.assertEqual(cc.findings(text), [2])

    def test_negated_nested_and_multiline_conditions_are_found(self):
        text = ("if (!co_await a()) co_return;\n"
                "while (x && (y || co_await b())) {}\n"
                "} else if (ready &&\n"
                "           !co_await c(f(1), g(2))) {\n")
        self.assertEqual(cc.findings(text), [1, 2, 3])

    def test_an_awaited_local_then_tested_is_fine(self):
        text = ("const bool written = co_await exchange.writeChunk(data);\n"
                "if (written) co_await exchange.finishChunked();\n"
                "while (pending()) co_await step();\n"
                "for (int i = 0; i < n; ++i) co_await step();\n")
        self.assertEqual(cc.findings(text), [])

    def test_comments_and_strings_do_not_count(self):
        text = ("// if (co_await x) is miscompiled\n"
                "/* while (co_await y) */\n"
                'log("if (co_await z)");\n'
                'const char* s = R"(if (co_await w))";\n'
                "if (done) {}  // co_await\n")
        self.assertEqual(cc.findings(text), [])


class SourcesTest(unittest.TestCase):
    def test_no_source_awaits_in_a_condition(self):
        root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
        self.assertEqual(cc.main(["check_coroutines.py", root]), 0,
                         "the lines above await in a condition")


if __name__ == "__main__":
    unittest.main()
