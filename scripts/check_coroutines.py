#!/usr/bin/env python3
"""Finds the `co_await` shapes GCC 12 miscompiles in the C++ sources.

Usage: check_coroutines.py [ROOT]   (exit 1 and one line per finding)

GCC 12 (Debian 12's compiler) miscompiles a coroutine that awaits in an
`if`, `while`, `switch` or classic `for` condition when the coroutine has no
local variable: its first resumption jumps to a trap or a wild address. The
router died that way when a decode agent broke off after its last token.
It also evaluates both sides of `?:` and `&&`/`||` whose operands await
(`co_return c && co_await f();` awaits f() when c is false). The project's
rules are simpler than the bugs' conditions: no `co_await` in a condition
(a range-for's range is fine), and none as an operand of `?:`, `&&` or
`||`; await into a named local, then test it.

    const bool written = co_await exchange.writeChunk(data);
    if (written) co_await exchange.finishChunked();
"""

import os
import re
import sys

DIRECTORIES = ("agent", "common", "kernels", "operator", "tests", "tools")
EXTENSIONS = (".cpp", ".h", ".cu", ".cuh")
CONDITION = re.compile(r"\b(?:if|while|switch|for)\s*\(")
AWAIT = re.compile(r"\bco_await\b")
# Binary && and || as the project's format writes them (`T&& x` is a type).
LOGICAL = re.compile(r"\s(?:&&|\|\|)\s")


def code_only(text):
    """`text` with comments and string/char literals blanked (newlines kept)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("".join(ch if ch == "\n" else " " for ch in text[i:j]))
            i = j
        elif text.startswith('R"', i):
            open_paren = text.find("(", i)
            delimiter = text[i + 2:open_paren]
            j = text.find(")" + delimiter + '"', open_paren)
            j = n if j < 0 else j + len(delimiter) + 2
            out.append("".join(ch if ch == "\n" else " " for ch in text[i:j]))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(" " * (j - i))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def is_range_for(header):
    """Whether a `for` header (inside its parentheses) is a range-for: a `:`
    (not `::`) and no `;` at its own nesting level."""
    depth = 0
    colon = False
    for i, c in enumerate(header):
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif depth == 0 and c == ";":
            return False
        elif depth == 0 and c == ":" and header[i - 1:i] != ":" and header[i + 1:i + 2] != ":":
            colon = True
    return colon


def level_bounds(code, at):
    """(start, end) of the text around position `at` at its own nesting
    level: back to the start of its statement, a comma or the enclosing
    bracket, forward likewise to its end."""
    def scan(index, step, opening, closing):
        depth = 0
        while 0 <= index < len(code):
            c = code[index]
            if c in closing:
                depth += 1
            elif c in opening:
                if depth == 0:
                    return index
                depth -= 1
            elif depth == 0 and c in ";,":
                return index
            index += step
        return index
    start = scan(at - 1, -1, "([{", ")]}") + 1
    end = scan(at, 1, ")]}", "([{")
    return start, end


def flat(text):
    """`text` with the contents of nested brackets blanked."""
    out, depth = [], 0
    for c in text:
        if c in ")]}":
            depth -= 1
        out.append(c if depth == 0 else " ")
        if c in "([{":
            depth += 1
    return "".join(out)


def awaits_as_operand(code, at):
    """Whether the co_await at `at`, or a bracketed expression around it
    (up to its statement or a lambda's body), is an operand of ?:, && or
    ||."""
    while True:
        start, end = level_bounds(code, at)
        span = flat(code[start:end])
        if "?" in span or LOGICAL.search(span):
            return True
        if start == 0 or code[start - 1] not in "([":
            return False
        at = start - 1  # the enclosing bracket, seen from the level above


def findings(text):
    """(line, what) of each co_await in a condition or as an operand of ?:,
    && or ||; lines 1-based."""
    code = code_only(text)
    found = []
    for match in CONDITION.finditer(code):
        depth, j = 1, match.end()
        while j < len(code) and depth > 0:
            depth += {"(": 1, ")": -1}.get(code[j], 0)
            j += 1
        header = code[match.end():j - 1]
        if match.group(0).startswith("for") and is_range_for(header):
            continue
        if AWAIT.search(header):
            found.append((code.count("\n", 0, match.start()) + 1, "in a condition"))
    for match in AWAIT.finditer(code):
        if awaits_as_operand(code, match.start()):
            found.append((code.count("\n", 0, match.start()) + 1, "as an operand of ?:, && or ||"))
    return sorted(set(found))


def main(argv):
    root = argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    found = 0
    for directory in DIRECTORIES:
        for folder, _, files in os.walk(os.path.join(root, directory)):
            for name in sorted(files):
                if not name.endswith(EXTENSIONS):
                    continue
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8", errors="replace") as f:
                    text = f.read()
                for line, what in findings(text):
                    found += 1
                    print(f"{os.path.relpath(path, root)}:{line}: co_await {what}: await into a "
                          "named local, then test it (scripts/check_coroutines.py)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
