#!/usr/bin/env python3
"""Finds `co_await` in an `if` or `while` condition in the C++ sources.

Usage: check_coroutines.py [ROOT]   (exit 1 and one line per finding)

GCC 12 (Debian 12's compiler) miscompiles a coroutine that awaits in an
`if` or `while` condition when the coroutine has no local variable: its first
resumption jumps to a trap or a wild address. The router died that way when a
decode agent broke off after its last token. The project's rule is simpler
than the bug's condition: await into a named local, then test it.

    const bool written = co_await exchange.writeChunk(data);
    if (written) co_await exchange.finishChunked();
"""

import os
import re
import sys

DIRECTORIES = ("agent", "common", "kernels", "operator", "tests", "tools")
EXTENSIONS = (".cpp", ".h", ".cu", ".cuh")
CONDITION = re.compile(r"\b(?:if|while)\s*\(")
AWAIT = re.compile(r"\bco_await\b")


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


def findings(text):
    """Line numbers (1-based) of conditions that contain a co_await."""
    code = code_only(text)
    lines = []
    for match in CONDITION.finditer(code):
        depth, j = 1, match.end()
        while j < len(code) and depth > 0:
            depth += {"(": 1, ")": -1}.get(code[j], 0)
            j += 1
        if AWAIT.search(code, match.end(), j):
            lines.append(code.count("\n", 0, match.start()) + 1)
    return lines


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
                for line in findings(text):
                    found += 1
                    print(f"{os.path.relpath(path, root)}:{line}: co_await in a condition: "
                          "await into a named local, then test it (scripts/check_coroutines.py)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
