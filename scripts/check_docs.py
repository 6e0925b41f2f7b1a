#!/usr/bin/env python3
"""Compile every ```cpp block of README.md and docs/*.md (g++ -std=c++20 -fsyntax-only), so that a page
cannot drift from the code.

    scripts/check_docs.py [--cxx g++] [--jobs 2] [--keep DIR] [-v] [FILE.md ...]

Each block is placed in a namespace of its own, after a prelude: the umbrella header,
`namespace rs = resilience;`, `using namespace std::chrono_literals;` and the user-side names the pages
take for granted (`fetch`, `page`, `policy`, ...), from scripts/check_docs_prelude.hpp. The block is cut
into its top-level pieces: `#include` lines go to the top of the file; classes, function definitions and
declarations, and the declarations before them, stay at namespace scope; the statements and the
declarations among them go into a function body (a coroutine when they use co_await or co_return), where
a name a lambda captures explicitly is bound to a local. `#line` directives make every compiler message
point at the page and the line of the block. g++ is the reference (the docs_compile test); clang compiles them
too (with clang and libstdc++, standalone Asio 1.22 has no asio::awaitable, so the pages await Asio on Boost).

An HTML comment right above a block (blank lines between are allowed) changes what it gets:

    <!-- doc-prelude: NAME -->          the names of namespace doc_prelude::ctx_NAME of the prelude too (for
                                        a page whose `fetch` makes an int, or Asio's objects); asio and redis
                                        also bring in standalone Asio and resilience/redis.hpp, as does a
                                        block that mentions asio:: or redis; boost_asio brings in
                                        Boost.Asio, Beast and resilience/boost_asio.hpp instead (its
                                        blocks are skipped, and said so, where Boost's headers are missing)
    <!-- doc-check: body [TYPE] -->     the whole block is statements; TYPE: the function's return type
                                        (default: a coroutine that accepts any co_return, or void)
    <!-- doc-check: fields TYPE -->     the block is designated initializers of TYPE (`.x = ...,`)
    <!-- doc-check: global -->          the block is compiled at global scope (explicit specialisations)
    <!-- doc-check: define MACRO (why) --> compile the block with MACRO defined, in a file of its own
    <!-- doc-check: excerpt PATH -->    not compiled here: its lines (blank lines and indentation aside)
                                        must appear, in order and together, in PATH, which is compiled
    <!-- doc-check: skip (why) -->      not compiled: a synopsis or pseudo-code; the reason is required

Blocks are grouped into a few translation units (one per set of macros and Asio use, split across the
jobs), so the headers are parsed a few times, not once per block. Exit status 1 when a block does not
compile; each failure is reported as the page, the line of the block and the compiler's message.
"""

import argparse
import concurrent.futures
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRELUDE = Path(__file__).resolve().parent / "check_docs_prelude.hpp"

FENCE_OPEN = re.compile(r"^(\s*)```cpp\s*$")
FENCE_CLOSE = re.compile(r"^\s*```\s*$")
MARKER = re.compile(r"^\s*<!--\s*doc-(check|prelude)\s*:\s*(.*?)\s*-->\s*$")

STATEMENT_KEYWORDS = {"if", "for", "while", "do", "switch", "return", "co_return", "co_await", "co_yield",
                      "try", "catch", "throw", "break", "continue", "else"}
SCOPE_KEYWORDS = {"template", "struct", "class", "enum", "union", "namespace", "typedef", "using",
                  "static_assert", "concept", "extern"}
DECL_SPECIFIERS = {"const", "constexpr", "static", "inline", "thread_local", "volatile", "typename",
                   "unsigned", "signed", "long", "short", "mutable", "explicit", "virtual", "friend"}


@dataclass
class Block:
    path: str            # relative to the repository root
    line: int            # line of the opening fence
    first: int           # line of the first line of code
    text: str            # the code, the fence's indentation removed
    contexts: list = field(default_factory=list)
    mode: str = "auto"   # auto, body, fields
    fields_type: str = ""
    body_type: str = ""
    excerpt: str = ""
    defines: list = field(default_factory=list)
    skip: str = ""

    @property
    def where(self):
        return f"{self.path}:{self.line}"

    @property
    def needs_boost(self):
        return "boost_asio" in self.contexts

    @property
    def needs_asio(self):
        if self.needs_boost:
            return False
        return any(c in ("asio", "redis") for c in self.contexts) or bool(re.search(r"\basio::|redis", self.text))


class DocError(Exception):
    pass


def read_blocks(path):
    rel = os.path.relpath(path, ROOT)
    lines = Path(path).read_text(encoding="utf-8").split("\n")
    blocks = []
    i = 0
    while i < len(lines):
        m = FENCE_OPEN.match(lines[i])
        if not m:
            i += 1
            continue
        indent = len(m.group(1))
        j = i + 1
        while j < len(lines) and not FENCE_CLOSE.match(lines[j]):
            j += 1
        if j == len(lines):
            raise DocError(f"{rel}:{i + 1}: ```cpp block is not closed")
        code = [ln[indent:] if ln[:indent].strip() == "" else ln for ln in lines[i + 1:j]]
        block = Block(rel, i + 1, i + 2, "\n".join(code))
        # The markers: the HTML comments right above the fence (blank lines between are allowed).
        k = i - 1
        while k >= 0 and (lines[k].strip() == "" or MARKER.match(lines[k])):
            mm = MARKER.match(lines[k])
            if mm:
                apply_marker(block, mm.group(1), mm.group(2), f"{rel}:{k + 1}")
            k -= 1
        blocks.append(block)
        i = j + 1
    return blocks


def apply_marker(block, kind, value, where):
    if kind == "prelude":
        names = [n.strip() for n in value.split(",") if n.strip()]
        for n in names:
            if not re.fullmatch(r"\w+", n):
                raise DocError(f"{where}: doc-prelude takes names of the prelude's namespaces, got {n!r}")
        block.contexts += names
        if len(block.contexts) > 1:
            raise DocError(f"{where}: doc-prelude takes one name (a namespace ctx_<name> of the prelude)")
        return
    m = re.fullmatch(r"(\w+)\s*(.*)", value)
    verb, rest = (m.group(1), m.group(2)) if m else ("", "")
    if verb == "skip":
        if not re.fullmatch(r"\(.+\)", rest):
            raise DocError(f"{where}: doc-check: skip needs a reason in parentheses")
        block.skip = rest[1:-1]
    elif verb == "body":
        block.mode, block.body_type = "body", rest
    elif verb == "global":
        block.mode = "global"
    elif verb == "excerpt":
        if not rest or not (ROOT / rest).is_file():
            raise DocError(f"{where}: doc-check: excerpt needs the path of an existing file, got {rest!r}")
        block.excerpt = rest
    elif verb == "fields":
        if not rest:
            raise DocError(f"{where}: doc-check: fields needs the type the fields belong to")
        block.mode, block.fields_type = "fields", rest
    elif verb == "define":
        mm = re.fullmatch(r"(\w+(?:=\S*)?)\s*\((.+)\)", rest)
        if not mm:
            raise DocError(f"{where}: doc-check: define needs a macro and a reason in parentheses")
        block.defines.append(mm.group(1))
    else:
        raise DocError(f"{where}: unknown doc-check {value!r} (skip, body, fields, global, define, excerpt)")


# ---------------------------------------------------------------------------------------------------------
# Cutting a block into its top-level pieces.

def mask(text):
    """The text with comments, string and character literals blanked out (same length, newlines kept)."""
    out = list(text)
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            for k in range(i, j):
                out[k] = " "
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            for k in range(i, j):
                if out[k] != "\n":
                    out[k] = " "
            i = j
        elif c in "\"'" and not (c == "'" and i > 0 and text[i - 1].isalnum()):  # 1'000 digit separators
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            for k in range(i + 1, min(j, n)):
                out[k] = " "
            i = j + 1
        else:
            i += 1
    return "".join(out)


def split_items(text):
    """Top-level pieces of a block: (start offset, end offset), ending at a `;` or at the `}` that closes a
    function, a class or a compound statement at depth 0, and at the end of a preprocessor line."""
    m = mask(text)
    items = []
    depth = 0
    start = 0
    i, n = 0, len(m)
    while i < n:
        c = m[i]
        if c == "#" and depth == 0 and m[start:i].strip() == "":
            j = m.find("\n", i)
            j = n if j < 0 else j
            items.append((i, j))
            start = i = j
            continue
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if c == "}" and depth == 0:
                rest = m[i + 1:].lstrip()
                follows = re.match(r"\w+", rest)
                if not (rest[:1] in (";", ",", ")", ".", "(", "[", "-")
                        or (follows and follows.group(0) in ("else", "catch"))):
                    items.append((start, i + 1))
                    start = i + 1
        elif c == ";" and depth == 0:
            items.append((start, i + 1))
            start = i + 1
        i += 1
    if m[start:].strip():
        items.append((start, n))
    return items


def skip_type(s, i):
    """Index after a type name at s[i:] (`rs::x<...>::y`, `auto`), or -1."""
    m = re.match(r"\s*(?:::)?\w+", s[i:])
    if not m:
        return -1
    i += m.end()
    while True:
        j = i
        while j < len(s) and s[j] in " \t\n":
            j += 1
        if j < len(s) and s[j] == "<":
            depth = 0
            while j < len(s):
                if s[j] == "<":
                    depth += 1
                elif s[j] == ">":
                    depth -= 1
                    if depth == 0:
                        break
                elif s[j] in ";{}":
                    return -1
                j += 1
            if j == len(s):
                return -1
            i = j + 1
            continue
        m = re.match(r"\s*::\s*(?:template\s+)?\w+", s[i:])
        if m:
            i += m.end()
            continue
        return i


def classify(masked):
    """scope (only at namespace scope), decl (either), stmt (only in a function body), pre, blank."""
    s = masked.strip()
    if not s:
        return "blank"
    if s.startswith("#"):
        return "pre"
    first = re.match(r"[\w:]+|\S", s).group(0)
    if first in STATEMENT_KEYWORDS or s.startswith("{") or s.startswith("..."):
        return "stmt"
    if first in SCOPE_KEYWORDS:
        return "scope"
    if re.search(r"\bco_(await|yield|return)\b", top_level(s)):
        return "stmt"
    # A declaration: specifiers, a type, then a declarator (a name, `[` of a structured binding, * or &).
    i = 0
    while True:
        m = re.match(r"\s*(\w+)\b", s[i:])
        if m and m.group(1) in DECL_SPECIFIERS:
            i += m.end()
        else:
            break
    j = skip_type(s, i)
    if j < 0:
        return "stmt"
    m = re.match(r"\s*[*&]*\s*(?:\[|(?:::)?\w)", s[j:])
    if not m:
        return "stmt"
    if s.endswith("}") and not s.endswith("};"):
        return "scope"   # a function definition
    if is_function_declaration(s[j:]):
        return "scope"
    if re.search(r"\[\s*[&=\w][^\]]*\]\s*(?:\(|->|\{|mutable)", s):
        return "stmt"    # a lambda that captures: only in a function
    return "decl"


def captured_names(masked):
    """Names captured explicitly by the lambdas in `masked` (`[a, &b]`; not `[x = y]` nor `[&]`)."""
    names = set()
    for m in re.finditer(r"\[([^\[\]]*)\]\s*(?:\(|->|\{|mutable)", masked):
        for part in m.group(1).split(","):
            mm = re.fullmatch(r"\s*&?\s*([A-Za-z_]\w*)\s*", part)
            if mm and mm.group(1) != "this":
                names.add(mm.group(1))
    return names


def prelude_objects():
    """The names of the objects the prelude declares (`extern T a, b;`)."""
    names = set()
    for m in re.finditer(r"^\s*extern\s+[^;(]*?([\w\s,]+);", PRELUDE.read_text(encoding="utf-8"), re.M):
        names.update(n.strip() for n in m.group(1).split(",")[1:])
        last = re.search(r"(\w+)\s*$", m.group(1).split(",")[0])
        if last:
            names.add(last.group(1))
    return names


PRELUDE_OBJECTS = prelude_objects()


def is_function_declaration(declarator):
    """`name(params);` whose first parameter is a type (`std::stop_token`, `const T& x`, `int n`), or `()`."""
    m = re.match(r"\s*[*&]*\s*\w+\s*\((.*)\)\s*(?:const\s*)?(?:noexcept\s*)?;?\s*$", declarator, re.S)
    if not m:
        return False
    first = m.group(1).split(",")[0].strip()
    return first == "" or bool(re.search(r"::|<|[&*]$|^const\b|^(?:int|bool|double|long|char|auto)\b", first)
                               or re.fullmatch(r"[\w:<>]+\s+[&*]*\s*\w+(?:\s*=.*)?", first))


def is_excerpt(text, source):
    """Do the non-blank lines of `text`, stripped, appear consecutively among those of `source`?"""
    want = [ln.strip() for ln in text.split("\n") if ln.strip()]
    have = [ln.strip() for ln in source.read_text(encoding="utf-8").split("\n") if ln.strip()]
    return any(have[i:i + len(want)] == want for i in range(len(have) - len(want) + 1))


def top_level(s):
    """s without what is inside braces (lambda bodies, initializers)."""
    out, depth = [], 0
    for c in s:
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        elif depth == 0:
            out.append(c)
    return "".join(out)


# ---------------------------------------------------------------------------------------------------------
# Building the translation units.

def line_directive(block, offset):
    line = block.first + block.text.count("\n", 0, offset)
    col = offset - (block.text.rfind("\n", 0, offset) + 1)
    return f'#line {line} "{block.path}"\n' + " " * col


def render(block, index):
    """(lines for the top of the file, the block's namespace)."""
    text = re.sub(r"(?m)^(\s*)\.\.\.\s*$", lambda m: m.group(1) + "   ", block.text)  # elided lines
    block.text = text
    head, body = [], []
    # The block's namespace sits inside doc_prelude (and inside its context's namespace there), so that
    # ordinary lookup finds the block's own names first, then the context's, then the common ones.
    ctx = [c for c in block.contexts]
    opening = "namespace doc_prelude { " + "".join(f"namespace ctx_{c} {{ " for c in ctx)
    ns = [opening + f"namespace doc_block_{index} {{  // {block.where}",
          "namespace rs = resilience;",
          "using namespace std::chrono_literals;"]
    if block.mode == "global":
        return head, ["namespace rs = resilience;", line_directive(block, 0) + text]
    if block.mode == "fields":
        ns.append(f"[[maybe_unused]] inline const {block.fields_type} doc_fields{{")
        ns.append(line_directive(block, 0) + text)
        ns.append("};")
    else:
        masked = mask(text)
        pieces = [(s, e, classify(masked[s:e])) for s, e in split_items(text)]
        # Declarations after the last class or function definition go into the body with the statements
        # among them, so that the lambdas there may capture them (only a local can be captured by name).
        last_scope = max([k for k, (_, _, kind) in enumerate(pieces) if kind == "scope"], default=-1)
        tail_in_body = any(kind == "stmt" for _, _, kind in pieces[last_scope + 1:])
        in_body = block.mode == "body"
        scope_parts, body_parts = [], []
        for k, (s, e, kind) in enumerate(pieces):
            chunk = line_directive(block, s) + text[s:e]
            if kind == "pre":
                head.append(chunk)
            elif kind == "scope":
                scope_parts.append(chunk)
            elif kind == "stmt" or in_body or (tail_in_body and k > last_scope):
                in_body = kind != "blank" or in_body
                body_parts.append(chunk)
            else:
                scope_parts.append(chunk)
        ns += scope_parts
        ns += [f"#ifdef DOC_PRELUDE_LATE_{c}\nDOC_PRELUDE_LATE_{c}\n#endif" for c in ctx]
        if body_parts:
            body = mask("\n".join(body_parts))
            coroutine = re.search(r"\bco_(await|return|yield)\b", body)
            ret = block.body_type or ("doc_check::any_task" if coroutine else "void")
            ns.append(f"[[maybe_unused]] {ret} doc_body() {{")
            # A name captured explicitly must be a local: each one the prelude (or the block, at namespace
            # scope) declares is bound to a local reference of the same name, in a scope around the block's
            # statements, which may declare the name again.
            captured = sorted(n for n in captured_names(body)
                              if n in PRELUDE_OBJECTS or re.search(rf"\b{n}\s*[{{=(;]", mask("\n".join(scope_parts))))
            ns += [f"auto& doc_ref_{n} = {n};" for n in captured]
            ns.append("{ " + " ".join(f"auto& {n} = doc_ref_{n};" for n in captured) + " {")
            ns += body_parts
            ns.append("}}}")
    ns.append("}" * (2 + len(ctx)) + f"  // namespace doc_block_{index}")
    return head, ns


def translation_unit(blocks, first_index):
    defines = sorted({d for b in blocks for d in b.defines})
    asio = any(b.needs_asio for b in blocks)
    boost = any(b.needs_boost for b in blocks)
    out = ["// Generated by scripts/check_docs.py from the ```cpp blocks of the docs."]
    out += [f"#define {d.replace('=', ' ', 1)}" for d in defines]
    if asio:
        out.append("#define DOC_CHECK_ASIO 1")
    if boost:
        out.append("#define DOC_CHECK_BOOST_ASIO 1")
    out.append(f'#include "{PRELUDE}"')
    bodies = []
    for k, b in enumerate(blocks):
        head, ns = render(b, first_index + k)
        out += head
        bodies += ns
    out.append('#line 1 "check_docs: the blocks"')
    out += bodies
    return "\n".join(out) + "\n"


def has_boost_headers(cxx, flags):
    """Whether `cxx` finds Boost.Asio and Beast (the blocks of the boost_asio context need them)."""
    probe = "#if __has_include(<boost/asio.hpp>) && __has_include(<boost/beast/http.hpp>)\nint found;\n#endif\n"
    proc = subprocess.run([cxx, "-std=c++20", "-E", *flags, "-x", "c++", "-"], input=probe, capture_output=True,
                          text=True)
    return proc.returncode == 0 and "int found;" in proc.stdout


def compile_unit(cxx, flags, source):
    cmd = [cxx, "-std=c++20", "-fsyntax-only", f"-I{ROOT / 'include'}", "-DASIO_STANDALONE", "-w",
           *flags, "-x", "c++", source]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    return proc.returncode, proc.stdout + proc.stderr, cmd


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="*", help="pages to check (default: README.md and docs/*.md)")
    ap.add_argument("--cxx", default=os.environ.get("CXX", "g++"), help="compiler (default: $CXX or g++)")
    ap.add_argument("--jobs", "-j", type=int, default=2, help="compilers run at once (default 2)")
    ap.add_argument("--flags", default="", help="extra compiler flags, one string")
    ap.add_argument("--keep", help="write the generated files to this directory and keep them")
    ap.add_argument("--verbose", "-v", action="store_true", help="list every block and where it went")
    args = ap.parse_args()
    started = time.monotonic()

    files = [Path(f).resolve() for f in args.files] or [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    try:
        blocks = [b for f in files for b in read_blocks(f)]
    except DocError as e:
        print(f"check_docs: {e}", file=sys.stderr)
        return 1
    excerpts = [b for b in blocks if b.excerpt and not b.skip]
    drifted = [b for b in excerpts if not is_excerpt(b.text, ROOT / b.excerpt)]
    for b in drifted:
        print(f"check_docs: {b.where}: the block is not an excerpt of {b.excerpt} (any more): "
              f"its lines, indentation and blank lines aside, are not found there in order", file=sys.stderr)
    flags = shlex.split(args.flags)
    if any(b.needs_boost and not b.skip and not b.excerpt for b in blocks) and not has_boost_headers(args.cxx, flags):
        for b in blocks:
            if b.needs_boost and not b.skip and not b.excerpt:
                b.skip = "Boost.Asio and Beast not found"
                print(f"check_docs: {b.where}: skipped (Boost.Asio and Beast not found by {args.cxx})")
    checked = [b for b in blocks if not b.skip and not b.excerpt]
    skipped = [b for b in blocks if b.skip]
    for b in skipped:
        if args.verbose:
            print(f"check_docs: {b.where}: skipped ({b.skip})")

    # Group: one key per set of macros and Asio; the largest group is split across the jobs.
    groups = {}
    for b in checked:
        groups.setdefault((tuple(sorted(b.defines)), b.needs_asio, b.needs_boost), []).append(b)
    units = []
    for key, members in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        parts = max(1, args.jobs - len(groups) + 1) if key == ((), False, False) else 1
        size = -(-len(members) // parts)
        for p in range(parts):
            chunk = members[p * size:(p + 1) * size]
            if chunk:
                units.append(chunk)

    workdir = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="check_docs."))
    workdir.mkdir(parents=True, exist_ok=True)
    for old in workdir.glob("docs_*.cpp"):
        old.unlink()
    sources = []
    index = 0
    for u, members in enumerate(units):
        src = workdir / f"docs_{u}.cpp"
        src.write_text(translation_unit(members, index), encoding="utf-8")
        index += len(members)
        sources.append(src)
        if args.verbose:
            print(f"check_docs: {src}: " + ", ".join(b.where for b in members))

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = list(pool.map(lambda s: compile_unit(args.cxx, flags, str(s)), sources))

    failed_blocks = {}
    failed_units = 0
    for src, members, (rc, output, cmd) in zip(sources, units, results):
        if rc == 0:
            continue
        failed_units += 1
        # Attribute each error to the block whose lines it names.
        for m in re.finditer(r"^([^\s:]+\.md):(\d+):(?:\d+:)? (?:fatal )?error", output, re.M):
            path, line = m.group(1), int(m.group(2))
            for b in members:
                if b.path == path and b.first <= line <= b.first + b.text.count("\n"):
                    failed_blocks.setdefault(b.where, b)
        print(f"check_docs: {src} (blocks: {', '.join(b.where for b in members)}) does not compile:\n"
              f"$ {shlex.join(cmd)}", file=sys.stderr)
        print(output, file=sys.stderr)
    if not args.keep and not failed_units:
        for s in sources:
            s.unlink()
        workdir.rmdir()

    elapsed = time.monotonic() - started
    if drifted and not failed_units:
        return 1
    if failed_units:
        print("check_docs: these blocks do not compile (the messages above say why):", file=sys.stderr)
        for where in sorted(failed_blocks):
            print(f"  {where}", file=sys.stderr)
        if not failed_blocks:
            print("  (errors outside the blocks: the prelude, scripts/check_docs_prelude.hpp?)", file=sys.stderr)
        print(f"check_docs: generated files kept in {workdir}", file=sys.stderr)
        return 1
    print(f"check_docs: {len(checked)} blocks of {len(files)} pages compile ({args.cxx}, {len(units)} files, "
          f"{args.jobs} jobs, {elapsed:.1f} s); {len(excerpts)} excerpts found in their sources; "
          f"{len(skipped)} skipped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
