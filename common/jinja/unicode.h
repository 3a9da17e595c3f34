// UTF-8 helpers for the Jinja engine: Python strings count code points, so
// length, indexing and slicing decode UTF-8; whitespace is Python's
// str.isspace() set.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tandem::jinja {

// Code points of `s`; an invalid byte decodes as itself (U+0080..U+00FF).
std::u32string decodeUtf8(std::string_view s);
std::string encodeUtf8(std::u32string_view s);
void appendUtf8(std::string& out, char32_t c);
size_t codePointCount(std::string_view s);
bool isPythonSpace(char32_t c);
bool isAscii(std::string_view s);

// str.find / str.rfind on bytes, in time linear in both strings; npos when
// absent.
size_t findText(std::string_view hay, std::string_view needle, size_t pos = 0);
size_t rfindText(std::string_view hay, std::string_view needle);

// Python's str.strip/lstrip/rstrip; `chars` null: whitespace.
std::string pyStrip(std::string_view s, const std::string* chars, bool left, bool right);
// Python's str.split(sep, maxsplit); `sep` null: runs of whitespace.
std::vector<std::string> pySplit(std::string_view s, const std::string* sep, long maxsplit);
// Python's str.splitlines() (without keepends).
std::vector<std::string> pySplitLines(std::string_view s);
std::string asciiUpper(std::string s);
std::string asciiLower(std::string s);

}  // namespace tandem::jinja
