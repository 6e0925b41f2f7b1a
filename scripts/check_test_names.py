#!/usr/bin/env python3
"""Every Catch2 test case name must survive catch_discover_tests: CMake lists are ';'-separated, so a
';' in a name splits it into two CTest entries that each match no test case and fail. Run from anywhere;
exits 1 naming each offending test case."""
import pathlib
import re
import sys

root = pathlib.Path(__file__).resolve().parent.parent
case = re.compile(r'\b(?:TEST_CASE|SCENARIO|TEMPLATE_TEST_CASE)\(\s*((?:"(?:[^"\\]|\\.)*"\s*)+)')
piece = re.compile(r'"((?:[^"\\]|\\.)*)"')
bad = []
for path in sorted((root / "tests").rglob("*.[ch]pp")):
    text = path.read_text()
    for match in case.finditer(text):
        name = "".join(piece.findall(match.group(1)))
        if ";" in name:
            line = text.count("\n", 0, match.start()) + 1
            bad.append(f"{path.relative_to(root)}:{line}: a ';' in the test name splits it in CTest: {name}")
print("\n".join(bad) if bad else "test names: none has a ';'")
sys.exit(1 if bad else 0)
