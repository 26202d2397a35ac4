#!/usr/bin/env python3
"""Writes unicode_ranges.hpp beside this file: Unicode 16.0's letters (General_Category L*) and numbers (N*) as PCRE2
class ranges, which pre_tokenizer.cpp puts in place of \\p{L} and \\p{N} so that the Split regex matches as Oniguruma
does in Hugging Face tokenizers 0.23 (Unicode 16.0 tables), whatever Unicode version the build's PCRE2 has.

  make_unicode_ranges.py [--check]   write the header; --check only compares it with what it would write (exit 1
                                     when they differ)

Run in the Debian sid root, whose Python has Unicode 16.0 tables:
  scripts/libtorch2.sh sid python examples/qwen_gsm8k/text/make_unicode_ranges.py
"""
import argparse
import os
import sys
import unicodedata

UNICODE_VERSION = "16.0.0"  # that of tokenizers 0.23's Oniguruma 6.9.10
HEADER = "unicode_ranges.hpp"
COMMAND = "scripts/libtorch2.sh sid python examples/qwen_gsm8k/text/make_unicode_ranges.py"
LINE_LIMIT = 120  # the repository's .clang-format ColumnLimit


def ranges_of(prefix):
    """The code points whose General_Category starts with `prefix` ("L" or "N"), as sorted (first, last) runs."""
    ranges = []
    for code in range(0x110000):
        if not unicodedata.category(chr(code)).startswith(prefix):
            continue
        if ranges and ranges[-1][1] == code - 1:
            ranges[-1][1] = code
        else:
            ranges.append([code, code])
    return ranges


def pcre2_items(ranges):
    """Each run in PCRE2 class syntax, \\x{41} or \\x{41}-\\x{5A}, the largest first (then by code point): PCRE2
    before 10.45 (Debian 12 has 10.42) tests a class's ranges one by one in the order written, so CJK ideographs and
    Hangul, the largest ranges, are then found after a few tests instead of some 400 (ASCII and Latin-1 are looked
    up in the class's bitmap first either way). Later PCRE2 sorts the ranges and searches them by halves."""
    ordered = sorted(ranges, key=lambda run: (run[0] - run[1], run[0]))
    return [f"\\x{{{first:X}}}" if first == last else f"\\x{{{first:X}}}-\\x{{{last:X}}}" for first, last in ordered]


def constant(name, comment, ranges):
    """A constexpr std::string_view made of raw string literals, one per line, each line within LINE_LIMIT."""
    lines = [f"// {comment}", f"inline constexpr std::string_view {name} ="]
    indent, current = "    ", ""
    room = LINE_LIMIT - len(indent) - len('R"()"')
    literals = []
    for item in pcre2_items(ranges):
        if len(current) + len(item) > room:
            literals.append(current)
            current = ""
        current += item
    literals.append(current)
    for i, literal in enumerate(literals):
        lines.append(f'{indent}R"({literal})"' + (";" if i + 1 == len(literals) else ""))
    return lines


def header():
    letters, numbers = ranges_of("L"), ranges_of("N")
    lines = [
        f"// Unicode {UNICODE_VERSION}'s letters (General_Category L*) and numbers (N*) as PCRE2 class ranges, for",
        "// pre_tokenizer.cpp. Generated, do not edit; regenerate with",
        f"//   {COMMAND}",
        "// The largest ranges come first: PCRE2 before 10.45 tests them in the order written.",
        "#pragma once",
        "",
        "#include <string_view>",
        "",
        "namespace qwen::detail {",
        "",
    ]
    lines += constant("kUnicodeLetters", f"\\p{{L}}: Lu, Ll, Lt, Lm and Lo ({len(letters)} ranges).", letters)
    lines.append("")
    lines += constant("kUnicodeNumbers", f"\\p{{N}}: Nd, Nl and No ({len(numbers)} ranges).", numbers)
    lines += ["", "}  // namespace qwen::detail", ""]
    too_long = [line for line in lines if len(line) > LINE_LIMIT]
    assert not too_long, too_long
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    if unicodedata.unidata_version != UNICODE_VERSION:
        raise SystemExit(f"make_unicode_ranges: this Python ({sys.version.split()[0]}) has Unicode "
                         f"{unicodedata.unidata_version} tables, but {UNICODE_VERSION} is needed (that of tokenizers "
                         f"0.23's Oniguruma); run it as: {COMMAND}")
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), HEADER)
    text = header()
    if args.check:
        with open(path, encoding="utf-8") as existing:
            if existing.read() != text:
                raise SystemExit(f"make_unicode_ranges: {path} differs from Unicode {UNICODE_VERSION}'s ranges")
        print(f"make_unicode_ranges: {path} is up to date")
        return
    with open(path, "w", encoding="utf-8") as out:
        out.write(text)
    print(f"make_unicode_ranges: wrote {path} (Unicode {unicodedata.unidata_version})")


if __name__ == "__main__":
    main()
