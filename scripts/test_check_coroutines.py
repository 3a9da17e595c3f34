#!/usr/bin/env python3
"""Tests of check_coroutines.py, then the check itself over the sources."""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True  # no __pycache__ in the source tree

import check_coroutines as cc  # noqa: E402


def lines(text):
    return [line for line, _ in cc.findings(text)]


class FindingsTest(unittest.TestCase):
    def test_an_await_in_a_condition_is_found_on_its_line(self):
        text = ("awaitable<void> endStream(HttpExchange& exchange) {\n"
                "  if (co_await exchange.writeChunk(done))\n"
                "    co_await exchange.finishChunked();\n"
                "}\n")
        self.assertEqual(cc.findings(text), [(2, "in a condition")])

    def test_negated_nested_and_multiline_conditions_are_found(self):
        text = ("if (!co_await a()) co_return;\n"
                "while (x && (y || co_await b())) {}\n"
                "} else if (ready &&\n"
                "           !co_await c(f(1), g(2))) {\n")
        # Line 2 and the await on line 4 are operands of && or || as well.
        self.assertEqual(lines(text), [1, 2, 2, 3, 4])

    def test_an_awaited_local_then_tested_is_fine(self):
        text = ("const bool written = co_await exchange.writeChunk(data);\n"
                "if (written) co_await exchange.finishChunked();\n"
                "while (pending()) co_await step();\n"
                "for (int i = 0; i < n; ++i) co_await step();\n")
        self.assertEqual(lines(text), [])

    def test_classic_for_and_switch_conditions_are_found_range_for_is_not(self):
        text = ("for (; co_await step();) {}\n"
                "switch (static_cast<int>(co_await kind())) {}\n"
                "for (int i = 0; i < co_await count(); ++i) {}\n"
                "for (const auto& x : co_await list()) {}\n"
                "for (auto [a, b] : pairs(std::string::npos)) co_await use(a);\n")
        self.assertEqual(lines(text), [1, 2, 3])

    def test_awaits_as_operands_of_conditional_and_logical_operators_are_found(self):
        text = ("co_return ready && co_await send();\n"
                "co_return a || co_await b();\n"
                "const bool ok = http10 ? co_await raw(d)\n"
                "                       : co_await chunk(d);\n"
                "sink(c ? co_await a() : 0, 1);\n"
                "co_return c && (co_await f());\n"
                "co_return c && static_cast<bool>(co_await f());\n"
                "x = c ? g(co_await a()) : b;\n")
        self.assertEqual(lines(text), [1, 2, 3, 4, 5, 6, 7, 8])

    def test_operators_beside_an_await_but_not_around_it_are_fine(self):
        text = ("auto&& value = co_await make();\n"
                "co_await send(a && b, c ? d : e);\n"
                "co_await offload<bool>([&] { return x || y; });\n"
                "const bool ok = co_await send();\n"
                "if (ok && more) co_await finish();\n"
                "case 1: co_await one(); break;\n"
                "x = c ? 1 : 2; co_await f();\n"
                "const int n = std::max(co_await count(), limit);\n"
                "run(a && b, [&]() -> awaitable<void> { co_await step(); });\n"
                "if (ready) { co_await go(); }\n")
        self.assertEqual(lines(text), [])

    def test_comments_and_strings_do_not_count(self):
        text = ("// if (co_await x) is miscompiled\n"
                "/* while (co_await y) */\n"
                'log("if (co_await z)");\n'
                'const char* s = R"(if (co_await w))";\n'
                "if (done) {}  // co_await\n")
        self.assertEqual(lines(text), [])


class SourcesTest(unittest.TestCase):
    def test_no_source_awaits_in_a_condition(self):
        root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
        self.assertEqual(cc.main(["check_coroutines.py", root]), 0,
                         "the lines above await in a condition")


if __name__ == "__main__":
    unittest.main()
