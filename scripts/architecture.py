#!/usr/bin/env python3
"""Measures the architecture of corral's non-test Rust code and names every breach of its rules.

The code measured: the crates of the repository's package (src/lib.rs, src/main.rs, src/bin/*.rs)
and of crates/*/ and bench/*/, each read from its root file by following `mod` declarations. Test
code is left out: items under `#[cfg(test)]` (and so the files they declare), files named
`tests.rs` or `*_tests.rs`, and anything under a `tests/`, `benches/` or `fuzz/` folder.

The rules:
1. No circle among the files of a folder. In each folder the nodes are its child modules (`x.rs`
   and `x/` together are one node, `x`, standing for everything under them); the folder's own file
   (`mod.rs`, `lib.rs`, `main.rs`, or `x.rs` for the folder `x/`) is its face, whose items belong
   to the folder as a whole. X -> Y when code in X names an item or module that lives in Y.
2. No cycle among the top-level modules of the package's library, the binary's modules counting
   as one room named `main` (the library's root folder is measured by this rule, not by rule 1).
3. No arrow from a lower room to a higher one, nor between the rooms of one level, by the map in
   ARCHITECTURE.md (the first fenced block under the `## Map` heading: one level a line, highest
   first, `room  description` or `a, b, c  description`). Every room appears exactly once.
4. Over corral's own code (SIZED_AREAS: src/): no function longer than MAX_FN_LINES, and 90 % of
   functions at most MAX_FN_P90 lines. A
   function runs from the line of its `fn` keyword (attributes and doc comments are not counted)
   to the line of its closing brace; a function nested in another counts on its own and as lines
   of the outer one; closures are lines of their function; declarations without a body are not
   functions.
5. Files, over the same code: the median and the 90th percentile of lines per file (as `wc -l` counts them, blank and
   comment lines included, lines of `#[cfg(test)]` items excluded) within MAX_FILE_MEDIAN and
   MAX_FILE_P90.

How a name is resolved: comments and literals are blanked first. Each `use` tree (braces, `self`,
globs, `as`) and each path in code (`crate::`, `self::`, `super::` chains, or a first segment that
names a child module, an item or an import of the scope) is followed to the deepest module, then
through that module's imports and globs (re-exports such as `pub use x::{A, B}` or `pub use x::*`)
to the module that defines the name, transitively. A name defined in a module stays there. A
first segment that is none of these (std, http, any external crate) is not followed. A bare name
(no `::`) counts only where a glob import of the scope could bring it, at its first use. The
package's binary reaches its library through the library's crate name (`corral::...`).

Usage: architecture.py [--json] [--root DIR] [--map FILE] [--self-test]
Exit status 1 when any rule is breached, 0 otherwise; the report is printed either way.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

# Longest function allowed, in lines: past this a function does several things.
MAX_FN_LINES = 60
# Length, in lines, that nine functions in ten stay within: most functions are small.
MAX_FN_P90 = 28
# Median lines per file: the typical file reads in one sitting.
MAX_FILE_MEDIAN = 150
# Lines per file that nine files in ten stay within: few files grow large.
MAX_FILE_P90 = 400
# The areas whose function and file lengths the limits hold: corral itself. The test engine and
# the GGUF helper (crates/) and the load generators (bench/) are tools; their lengths are reported,
# and their folders are held to the circle rule like the rest.
SIZED_AREAS = {"src"}
# How many of the longest functions and files the report lists.
WORST_SHOWN = 10

ROOT = Path(__file__).resolve().parent.parent
TEST_FOLDERS = {"tests", "benches", "fuzz"}
KEYWORDS = {"fn", "unsafe", "async", "extern", "const", "_", "impl", "for", "where", "dyn"}


# ---------------------------------------------------------------------------------------------
# Text: comments and literals blanked, test items removed, positions kept.


LITERAL_START = re.compile(r"/[/*]|(?<![\w])(?:br|cr|r)#*\"|\"|'")
CHAR_LITERAL = re.compile(r"'(?:\\(?:x[0-9a-fA-F]{2}|u\{[0-9a-fA-F_]{1,8}\}|.)|[^\\'\n])'")


def blank(chars: list[str], start: int, end: int) -> None:
    """Replaces chars[start:end] with spaces, keeping newlines so that line numbers hold."""
    for i in range(start, end):
        if chars[i] != "\n":
            chars[i] = " "


def block_comment_end(text: str, i: int) -> int:
    """The end of the (nestable) block comment that opens at i."""
    depth, i = 0, i
    while i < len(text):
        if text.startswith("/*", i):
            depth, i = depth + 1, i + 2
        elif text.startswith("*/", i):
            depth, i = depth - 1, i + 2
            if depth == 0:
                return i
        else:
            i += 1
    return len(text)


def string_end(text: str, i: int) -> int:
    """The index just past the closing quote of the string whose opening quote is at i."""
    i += 1
    while i < len(text):
        if text[i] == "\\":
            i += 2
        elif text[i] == '"':
            return i + 1
        else:
            i += 1
    return len(text)


def strip_literals(text: str) -> str:
    """The text with comments blanked and the insides of string and char literals blanked.

    Quotes stay, so a literal's value can still be read from the original at the same offsets.
    """
    chars = list(text)
    i = 0
    while (m := LITERAL_START.search(text, i)) is not None:
        start, token = m.start(), m.group()
        if token == "//":
            end = text.find("\n", start)
            end = len(text) if end < 0 else end
            blank(chars, start, end)
        elif token == "/*":
            end = block_comment_end(text, start)
            blank(chars, start, end)
        elif token.endswith('"') and token != '"':
            hashes = token.count("#")
            close = text.find('"' + "#" * hashes, m.end())
            end = len(text) if close < 0 else close + 1 + hashes
            blank(chars, m.end(), end - 1 - hashes)
        elif token == '"':
            end = string_end(text, start)
            blank(chars, start + 1, end - 1)
        else:
            char = CHAR_LITERAL.match(text, start)
            end = start + 1 if char is None else char.end()
            if char is not None:
                blank(chars, start + 1, end - 1)
        i = max(end, start + 1)
    return "".join(chars)


def matching_close(code: str, i: int) -> int:
    """The index of the bracket closing the one at i (code already stripped of literals)."""
    opening, closing = code[i], {"{": "}", "(": ")", "[": "]"}[code[i]]
    depth = 0
    for j in range(i, len(code)):
        if code[j] == opening:
            depth += 1
        elif code[j] == closing:
            depth -= 1
            if depth == 0:
                return j
    return len(code) - 1


CFG_TEST = re.compile(r"#\s*\[\s*cfg\s*\(\s*test\s*\)\s*\]")
INNER_CFG_TEST = re.compile(r"#\s*!\s*\[\s*cfg\s*\(\s*test\s*\)\s*\]")
ATTRIBUTE = re.compile(r"\s*#\s*!?\s*\[")
FIELD = re.compile(r"\s*(?:pub\s*(?:\([^)]*\))?\s*)?[A-Za-z_]\w*\s*:(?!:)")
SEMICOLON_ITEMS = {"use", "const", "static", "type", "let", "extern"}
ITEM_MODIFIERS = {"pub", "async", "unsafe", "default", "crate"}


def item_keyword(code: str, i: int) -> str:
    """The keyword of the item that starts at i: `fn` for `pub(crate) const unsafe fn`."""
    words = re.finditer(r"\(|[A-Za-z_]\w*", code[i : i + 200])
    for word in words:
        token = word.group()
        if token == "(":
            continue
        if token in ITEM_MODIFIERS or token in {"super", "self", "in"}:
            continue
        if token == "const":
            following = re.match(r"\s*(\w+)", code[i + word.end() : i + word.end() + 40])
            if following and following.group(1) in {"fn", "unsafe", "async", "extern"}:
                continue
        return token
    return ""


def item_end(code: str, i: int) -> int:
    """The end of the item that starts at i: past its closing brace or its semicolon (or, for a
    struct's field, at its comma)."""
    while (attr := ATTRIBUTE.match(code, i)) is not None:
        i = matching_close(code, attr.end() - 1) + 1
    if FIELD.match(code, i):
        return field_end(code, i)
    keyword = item_keyword(code, i)
    depth = 0
    j = i
    while j < len(code):
        ch = code[j]
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif ch == "{" and depth == 0:
            j = matching_close(code, j)
            if keyword not in SEMICOLON_ITEMS:
                return j + 1
        elif ch == ";" and depth == 0:
            return j + 1
        elif ch == "}" and depth == 0:
            return j
        j += 1
    return len(code)


def field_end(code: str, i: int) -> int:
    """The end of the struct field that starts at i: its comma, or the struct's closing brace."""
    depth = 0
    for j in range(i, len(code)):
        ch = code[j]
        if ch in "([{<":
            depth += 1
        elif ch in ")]}" or (ch == ">" and code[j - 1] != "-"):
            if depth == 0:
                return j
            depth -= 1
        elif ch == "," and depth == 0:
            return j + 1
    return len(code)


def remove_test_items(code: str) -> tuple[str, int]:
    """The code with every `#[cfg(test)]` item blanked, and how many whole lines those took."""
    chars = list(code)
    removed_lines: set[int] = set()
    for m in CFG_TEST.finditer(code):
        if chars[m.start()] == " ":
            continue  # inside an item already removed
        end = item_end(code, m.end())
        blank(chars, m.start(), end)
        first = code.count("\n", 0, m.start())
        last = code.count("\n", 0, max(end - 1, m.start()))
        removed_lines.update(range(first, last + 1))
    return "".join(chars), len(removed_lines)


def line_of(code: str, i: int) -> int:
    """The 1-based line of offset i."""
    return code.count("\n", 0, i) + 1


# ---------------------------------------------------------------------------------------------
# The module tree.


@dataclass(eq=False)
class Crate:
    name: str  # the name other crates of its package reach it by (the library's), or the binary's
    kind: str  # "lib" or "bin"
    root_file: Path
    area: str  # "src" for the package's own crates, else "crates/x" or "bench/x"
    is_package: bool  # the repository's own package (the map rule applies)
    library: Crate | None = None  # for a binary: the library of its package
    root: Module | None = None


@dataclass(eq=False)
class Module:
    crate: Crate
    name: str
    parent: Module | None
    file: Path
    inline: bool = False  # a `mod x { ... }` block, part of its file
    children: dict[str, Module] = field(default_factory=dict)
    types: set[str] = field(default_factory=set)  # structs, enums, traits, type aliases
    values: set[str] = field(default_factory=set)  # fns, consts, statics, macros
    imports: dict[str, list[str]] = field(default_factory=dict)
    globs: list[list[str]] = field(default_factory=list)
    child_dir: Path | None = None

    @property
    def file_module(self) -> Module:
        """The module whose file holds this one (itself unless inline)."""
        m = self
        while m.inline:
            m = m.parent
        return m

    def chain(self) -> list[Module]:
        """The file modules from the crate's root down to this one's file."""
        out, m = [], self.file_module
        while m is not None:
            out.append(m)
            m = m.parent.file_module if m.parent else None
        return out[::-1]


@dataclass
class SourceFile:
    path: Path
    rel: str
    area: str
    code: str  # literals blanked, test items removed
    lines: int  # wc -l less the lines of test items


@dataclass
class Reference:
    scope: Module
    segments: list[str]
    line: int
    text: str
    target: Module | None = None


@dataclass
class Function:
    rel: str
    area: str
    name: str
    line: int
    length: int


def is_test_file(path: Path) -> bool:
    """A file that holds tests only, by its name or folder."""
    name = path.name
    return (
        name == "tests.rs"
        or name.endswith("_tests.rs")
        or any(part in TEST_FOLDERS for part in path.parts[:-1])
    )


MOD_DECL = re.compile(r"(?<![\w#])mod\s+([A-Za-z_]\w*)\s*([;{])")
PATH_ATTR = re.compile(r"#\s*\[\s*path\s*=\s*\"")
ITEM_NAME = re.compile(
    r"(?<![\w#])(fn|struct|enum|trait|type|const|static|union|macro_rules\s*!)\s+([A-Za-z_]\w*)"
)
TYPE_ITEMS = {"struct", "enum", "trait", "type", "union"}
USE_DECL = re.compile(r"(?<![\w#])use\s+")
CODE_PATH = re.compile(r"(?<![\w:])(?:[A-Za-z_]\w*\s*::\s*)+[A-Za-z_]\w*")
BARE_NAME = re.compile(r"(?<![\w:.$'])[A-Za-z_]\w*(?!\w|\s*::|\s*!)")
USE_TOKEN = re.compile(r"::|[A-Za-z_]\w*|[{},*]|\S")


class Tree:
    """The crates read from disk: modules, their files, the references in them, the functions."""

    def __init__(self, root: Path):
        self.root = root = root.resolve()
        self.crates: list[Crate] = []
        self.files: list[SourceFile] = []
        self.references: list[Reference] = []
        self.functions: list[Function] = []
        self.warnings: list[str] = []
        self._resolving: dict[tuple[int, tuple[str, ...]], object] = {}
        self._glob_users: list[tuple[str, list]] = []
        for crate in discover_crates(root):
            self.crates.append(crate)
            crate.root = Module(crate, crate.name, None, crate.root_file)
            self.load(crate.root, crate.area)
        for code, scopes in self._glob_users:
            self.read_glob_names(code, scopes)
        for ref in self.references:
            ref.target = self.resolve_reference(ref)

    def rel(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix()

    # -- reading ------------------------------------------------------------------------------

    def load(self, module: Module, area: str) -> None:
        """Reads a module's file: its inline modules, child files, items, imports, references."""
        path = module.file
        raw = path.read_text(encoding="utf-8")
        code = strip_literals(raw)
        code, test_lines = remove_test_items(code)
        lines = raw.count("\n") - test_lines
        self.files.append(SourceFile(path, self.rel(path), area, code, lines))
        module.child_dir = child_dir(module)
        scopes = self.inline_modules(module, code)
        self.declare_children(module, code, raw, scopes, area)
        for m in ITEM_NAME.finditer(code):
            if m.group(2) not in KEYWORDS:
                scope = scope_at(scopes, m.start())
                names = scope.types if m.group(1) in TYPE_ITEMS else scope.values
                names.add(m.group(2))
        code_only = self.read_uses(code, scopes)
        self.read_code_paths(code_only, scopes)
        if any(scope.globs for _, _, scope in scopes):
            self._glob_users.append((code_only, scopes))
        self.functions.extend(find_functions(code, self.rel(path), area))

    def inline_modules(self, module: Module, code: str) -> list[tuple[int, int, Module]]:
        """The `mod x { ... }` blocks of a file as modules, with their spans (outermost first)."""
        scopes = [(0, len(code), module)]
        for m in MOD_DECL.finditer(code):
            if m.group(2) != "{":
                continue
            parent = scope_at(scopes, m.start())
            inner = Module(module.crate, m.group(1), parent, module.file, inline=True)
            inner.child_dir = parent.child_dir / m.group(1)
            parent.children[m.group(1)] = inner
            scopes.append((m.end() - 1, matching_close(code, m.end() - 1), inner))
        return scopes

    def declare_children(self, module, code, raw, scopes, area) -> None:
        """Loads the file of each `mod x;` of the file."""
        for m in MOD_DECL.finditer(code):
            if m.group(2) != ";":
                continue
            parent = scope_at(scopes, m.start())
            name = m.group(1)
            path = self.child_file(parent, name, path_attribute(code, raw, m.start()))
            if path is None:
                self.warnings.append(f"{self.rel(module.file)}:{line_of(code, m.start())}: "
                                     f"no file for `mod {name};`")
                continue
            if is_test_file(path) or INNER_CFG_TEST.search(strip_literals(path.read_text())):
                continue
            child = Module(module.crate, name, parent, path)
            parent.children[name] = child
            self.load(child, area)

    @staticmethod
    def child_file(parent: Module, name: str, attribute: str | None) -> Path | None:
        """The file of `mod name;` declared in parent, by Rust's rules (and `#[path]`)."""
        if attribute is not None:
            base = parent.child_dir if parent.inline else parent.file.parent
            candidates = [base / attribute]
        else:
            candidates = [parent.child_dir / f"{name}.rs", parent.child_dir / name / "mod.rs"]
        return next((c.resolve() for c in candidates if c.is_file()), None)

    def read_uses(self, code: str, scopes) -> str:
        """Records each `use` as imports of its scope and as references; returns the code with the
        use declarations blanked, for the scan of paths in code."""
        chars = list(code)
        for m in USE_DECL.finditer(code):
            end = use_end(code, m.end())
            scope = scope_at(scopes, m.start())
            for leaf in parse_use_tree(code, m.end(), end):
                segments, alias, glob, pos = leaf
                if glob:
                    scope.globs.append(segments)
                elif alias is not None:
                    scope.imports[alias] = segments
                text = "::".join(segments) + ("::*" if glob else "")
                self.references.append(Reference(scope, segments, line_of(code, pos), text))
            blank(chars, m.start(), end)
        return "".join(chars)

    def read_code_paths(self, code: str, scopes) -> None:
        """Records each path written in code (`a::b::c`) as a reference."""
        for m in CODE_PATH.finditer(code):
            segments = [s.strip() for s in m.group().split("::")]
            scope = scope_at(scopes, m.start())
            self.references.append(
                Reference(scope, segments, line_of(code, m.start()), "::".join(segments))
            )

    def read_glob_names(self, code: str, scopes) -> None:
        """Records the first use of each bare name that a glob import (`use x::*`) brings into a
        scope, as a reference through that glob (paths with `::` are read already)."""
        seen: set[tuple[int, str]] = set()
        for m in BARE_NAME.finditer(code):
            scope, name = scope_at(scopes, m.start()), m.group()
            if (id(scope), name) in seen or not scope.globs or name in KEYWORDS:
                continue
            seen.add((id(scope), name))
            if name in scope.children or name in scope.types or name in scope.values:
                continue
            if name in scope.imports:
                continue
            for glob in scope.globs:
                source = self.resolve(scope, glob)
                if source and source[0] == "module" and self.lookup(source[1], name):
                    text = "::".join(glob + [name])
                    self.references.append(
                        Reference(scope, glob + [name], line_of(code, m.start()), text)
                    )
                    break

    # -- resolving ----------------------------------------------------------------------------

    def resolve_reference(self, ref: Reference) -> Module | None:
        """The module that holds what the reference names, or None when it lies outside."""
        found = self.resolve(ref.scope, ref.segments)
        return None if found is None else found[1]

    def resolve(self, scope: Module, segments: list[str]) -> tuple[str, Module] | None:
        """("module", m) when the path names module m, ("item", m) when it names an item that
        lives in m, None when it leads outside the crates read (or cannot be followed)."""
        key = (id(scope), tuple(segments))
        if key in self._resolving:
            return self._resolving[key]
        self._resolving[key] = None  # a cycle of imports resolves to nothing
        found = self._resolve(scope, segments)
        self._resolving[key] = found
        return found

    def _resolve(self, scope: Module, segments: list[str]):
        first, rest = segments[0], segments[1:]
        if first == "crate":
            current = scope.crate.root
        elif first == "self":
            current = scope
        elif first == "super":
            current = scope.parent
        elif scope.crate.library is not None and first == scope.crate.library.name:
            current = scope.crate.library.root
        else:
            found = self.lookup(scope, first)
            if found is None or found[0] == "item":
                return found
            current = found[1]
        return self.walk(current, rest)

    def walk(self, current: Module | None, segments: list[str]):
        """Follows segments down from a module: children, then names, then imports."""
        for segment in segments:
            if current is None:
                return None
            if segment == "super":
                current = current.parent
                continue
            if segment == "self":
                continue
            found = self.lookup(current, segment)
            if found is None:
                return ("item", current)  # a name the module defines in a way not read here
            if found[0] == "item":
                return found
            current = found[1]
        return None if current is None else ("module", current)

    def lookup(self, module: Module, name: str):
        """What name means in a module: a child module, a type defined there, an import, a name
        a glob brings, or a value (fn, const) defined there."""
        if name in module.children:
            return ("module", module.children[name])
        if name in module.types:
            return ("item", module)
        if name in module.imports:
            return self.resolve(module, module.imports[name])
        for glob in module.globs:
            source = self.resolve(module, glob)
            if source is not None and source[0] == "module" and source[1] is not module:
                found = self.lookup(source[1], name)
                if found is not None:
                    return found
        if name in module.values:
            return ("item", module)
        return None


def scope_at(scopes: list[tuple[int, int, Module]], pos: int) -> Module:
    """The innermost module whose span holds pos."""
    inner = scopes[0][2]
    for start, end, module in scopes:
        if start <= pos <= end:
            inner = module
    return inner


def child_dir(module: Module) -> Path:
    """The folder that holds the files of a file module's `mod x;` children."""
    path = module.file
    if module.parent is None or path.name == "mod.rs":
        return path.parent
    return path.parent / path.stem


def path_attribute(code: str, raw: str, mod_start: int) -> str | None:
    """The value of a `#[path = "..."]` on the `mod` that starts at mod_start, if any."""
    before = max(code.rfind(";", 0, mod_start), code.rfind("}", 0, mod_start),
                 code.rfind("{", 0, mod_start))
    found = None
    for m in PATH_ATTR.finditer(code, before + 1, mod_start):
        close = code.find('"', m.end())
        found = raw[m.end() : close]
    return found


def use_end(code: str, i: int) -> int:
    """The end of the use declaration whose tree starts at i (its `;`, braces nested)."""
    depth = 0
    for j in range(i, len(code)):
        if code[j] == "{":
            depth += 1
        elif code[j] == "}":
            depth -= 1
        elif code[j] == ";" and depth <= 0:
            return j
    return len(code)


def parse_use_tree(code: str, start: int, end: int):
    """The leaves of a use tree: (segments, bound name or None, is a glob, offset)."""
    tokens = [(m.group(), start + m.start()) for m in USE_TOKEN.finditer(code[start:end])]
    tokens.append(("", end))
    leaves: list = []
    parse_subtree(tokens, 0, [], leaves)
    return leaves


def parse_subtree(tokens, i: int, prefix: list[str], leaves: list) -> int:
    """Parses one tree at tokens[i] under prefix, appending its leaves; returns the next index."""
    segments = list(prefix)
    if tokens[i][0] == "::":
        segments.append("::")  # a path from the extern prelude: always outside
        i += 1
    while True:
        token, pos = tokens[i]
        if token == "{":
            i += 1
            while tokens[i][0] not in ("}", ""):
                i = parse_subtree(tokens, i, segments, leaves)
                if tokens[i][0] == ",":
                    i += 1
            return i + 1
        if token == "*":
            leaves.append((segments, None, True, pos))
            return i + 1
        if not re.match(r"[A-Za-z_]", token):
            return i  # malformed: stop quietly
        segments.append(token)
        i += 1
        if tokens[i][0] == "::":
            i += 1
            continue
        alias = segments[-1]
        if segments[-1] == "self":
            segments = segments[:-1]
            alias = segments[-1] if segments else None
        if tokens[i][0] == "as":
            alias = tokens[i + 1][0]
            i += 2
        leaves.append((segments, None if alias == "_" else alias, False, pos))
        return i


FN_DECL = re.compile(r"(?<![\w#])fn\s+([A-Za-z_]\w*)")


def find_functions(code: str, rel: str, area: str) -> list[Function]:
    """Every function with a body in code (test items already removed)."""
    out = []
    for m in FN_DECL.finditer(code):
        body = body_start(code, m.end())
        if body is None:
            continue
        first = line_of(code, m.start())
        last = line_of(code, matching_close(code, body))
        out.append(Function(rel, area, m.group(1), first, last - first + 1))
    return out


def body_start(code: str, i: int) -> int | None:
    """The `{` opening the body of the fn whose signature continues at i; None for `;`."""
    depth = 0
    for j in range(i, len(code)):
        ch = code[j]
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif depth == 0 and ch == "{":
            return j
        elif depth == 0 and ch in ";}":
            return None
    return None


# ---------------------------------------------------------------------------------------------
# Crates.


def discover_crates(root: Path) -> list[Crate]:
    """The root package's crates, then those of crates/*/ and bench/*/ (with a Cargo.toml)."""
    crates = package_crates(root, root, "src", True)
    for group in ("crates", "bench"):
        for package in sorted((root / group).glob("*/Cargo.toml")):
            directory = package.parent
            crates += package_crates(root, directory, f"{group}/{directory.name}", False)
    return crates


def package_crates(root: Path, directory: Path, area: str, is_package: bool) -> list[Crate]:
    """The library and binaries of one package, by Cargo's default layout."""
    name = package_name(directory)
    src = directory / "src"
    library = None
    crates = []
    if (src / "lib.rs").is_file():
        library = Crate(name, "lib", (src / "lib.rs").resolve(), area, is_package)
        crates.append(library)
    binaries = [src / "main.rs"] + sorted((src / "bin").glob("*.rs"))
    for path in binaries:
        if path.is_file():
            crates.append(Crate(path.stem, "bin", path.resolve(), area, is_package, library))
    return crates


def package_name(directory: Path) -> str:
    """The name a package's library is reached by: [lib] name, else the package's, `-` as `_`."""
    manifest = directory / "Cargo.toml"
    if not manifest.is_file():
        return directory.name.replace("-", "_")
    data = tomllib.loads(manifest.read_text())
    name = data.get("lib", {}).get("name") or data.get("package", {}).get("name", directory.name)
    return name.replace("-", "_")


# ---------------------------------------------------------------------------------------------
# Graphs.


@dataclass
class Edge:
    count: int
    example: str  # file:line `path`


class Graph:
    """Arrows between named nodes, each with the number of references and the first one seen."""

    def __init__(self, name: str):
        self.name = name
        self.nodes: set[str] = set()
        self.edges: dict[tuple[str, str], Edge] = {}

    def add(self, source: str, target: str, example: str) -> None:
        self.nodes.update((source, target))
        edge = self.edges.get((source, target))
        if edge is None:
            self.edges[(source, target)] = Edge(1, example)
        else:
            edge.count += 1

    def components(self) -> list[list[str]]:
        """The strongly connected components with more than one node, each sorted."""
        succ: dict[str, list[str]] = {n: [] for n in self.nodes}
        for a, b in self.edges:
            succ[a].append(b)
        found = [sorted(c) for c in tarjan(sorted(self.nodes), succ) if len(c) > 1]
        return sorted(found)

    def rings(self, component: list[str]) -> list[list[str]]:
        """Short cycles that together take every arrow of the component: for each arrow a -> b,
        a -> b and the shortest way back from b to a. Each as nodes, the first repeated last."""
        inside = set(component)
        found: list[list[str]] = []
        for a, b in sorted(self.edges):
            if a not in inside or b not in inside:
                continue
            ring = [a] + self.shortest_path(b, a, inside)
            start = ring.index(min(ring[:-1]))
            ring = ring[start:-1] + ring[:start] + [ring[start]]
            if ring not in found:
                found.append(ring)
        return sorted(found, key=lambda r: (len(r), r))

    def shortest_path(self, source: str, target: str, inside: set[str]) -> list[str]:
        """The nodes of a shortest path from source to target within inside, both ends included."""
        previous = {source: source}
        frontier = [source]
        while frontier and target not in previous:
            following = []
            for node in frontier:
                for a, b in sorted(self.edges):
                    if a == node and b in inside and b not in previous:
                        previous[b] = node
                        following.append(b)
            frontier = following
        path = [target]
        while path[-1] != source:
            path.append(previous[path[-1]])
        return path[::-1]


def tarjan(nodes: list[str], succ: dict[str, list[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in succ[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            out.append(component)

    for v in nodes:
        if v not in index:
            visit(v)
    return out


def folder_name(tree: Tree, module: Module) -> str:
    """How the report names the folder of a module's children."""
    name = tree.rel(module.child_dir)
    if module.parent is None and module.crate.kind == "bin":
        siblings = [c for c in tree.crates if c.root_file.parent == module.crate.root_file.parent]
        if len(siblings) > 1:
            name += f" (binary {module.crate.name})"
    return name


def build_graphs(tree: Tree) -> tuple[dict[str, Graph], Graph]:
    """The arrows of each folder (rule 1) and between the package's rooms (rules 2 and 3)."""
    folders: dict[str, Graph] = {}
    rooms = Graph("rooms")
    for crate in tree.crates:
        if crate.is_package and crate.kind == "lib":
            rooms.nodes.update(crate.root.children)
        if crate.is_package and crate.kind == "bin" and crate.root.file.name == "main.rs":
            rooms.nodes.add("main")
    for ref in tree.references:
        if ref.target is None:
            continue
        example = f"{tree.rel(ref.scope.file)}:{ref.line} `{ref.text}`"
        add_folder_edge(tree, folders, ref.scope, ref.target, example)
        add_room_edge(rooms, ref.scope, ref.target, example)
    return folders, rooms


def add_folder_edge(tree, folders, source: Module, target: Module, example: str) -> None:
    """The arrow a reference draws in the folder where its two ends part."""
    a, b = source.chain(), target.chain()
    if a[0] is not b[0]:
        return  # another crate: only the rooms see it
    k = 0
    while k < min(len(a), len(b)) and a[k] is b[k]:
        k += 1
    if k == len(a) or k == len(b):
        return  # within one file, or to the face of a folder that holds the source
    folder = a[k - 1]
    if folder.parent is None and folder.crate.is_package and folder.crate.kind == "lib":
        return  # the library's top level: rule 2 measures it, with the binary
    name = folder_name(tree, folder)
    folders.setdefault(name, Graph(name)).add(a[k].name, b[k].name, example)


def room_of(module: Module) -> str | None:
    """The package's room a module lies in: its top-level module, or `main` for the binary."""
    crate = module.crate
    if not crate.is_package:
        return None
    if crate.kind == "bin":
        return "main" if crate.root_file.name == "main.rs" else None
    chain = module.chain()
    return chain[1].name if len(chain) > 1 else None


def add_room_edge(rooms: Graph, source: Module, target: Module, example: str) -> None:
    a, b = room_of(source), room_of(target)
    if a is not None and b is not None and a != b:
        rooms.add(a, b, example)


# ---------------------------------------------------------------------------------------------
# The map.


def read_map(path: Path) -> tuple[list[list[str]] | None, str | None]:
    """The levels of the map (highest first), or None and why it could not be read."""
    if not path.is_file():
        return None, f"{path.name} not found"
    lines = path.read_text(encoding="utf-8").splitlines()
    heading = next((i for i, line in enumerate(lines) if re.match(r"##\s+Map\b", line)), None)
    if heading is None:
        return None, f"{path.name} has no `## Map` section"
    block: list[str] | None = None
    for line in lines[heading + 1 :]:
        if block is None and line.startswith("## "):
            break
        if line.lstrip().startswith("```"):
            if block is not None:
                break
            block = []
        elif block is not None:
            block.append(line)
    if block is None:
        return None, f"the `## Map` section of {path.name} has no fenced block"
    levels = []
    for line in block:
        m = re.match(r"\s*([A-Za-z_]\w*(?:\s*,\s*[A-Za-z_]\w*)*)", line)
        if m:
            levels.append([name.strip() for name in m.group(1).split(",")])
    return levels, None


def map_breaches(levels: list[list[str]], rooms: Graph) -> list[str]:
    """Rooms missing, unknown or repeated in the map, and arrows against its order."""
    breaches = []
    level_of: dict[str, int] = {}
    for i, names in enumerate(levels):
        for name in names:
            if name in level_of:
                breaches.append(f"map: `{name}` appears more than once")
            elif name not in rooms.nodes:
                breaches.append(f"map: `{name}` is not a top-level module of src/ (nor `main`)")
            level_of.setdefault(name, i)
    for name in sorted(rooms.nodes - level_of.keys()):
        breaches.append(f"map: top-level module `{name}` is missing from the map")
    for (a, b), edge in sorted(rooms.edges.items()):
        if a not in level_of or b not in level_of:
            continue
        if level_of[b] < level_of[a]:
            breaches.append(f"map: {a} -> {b} points up the map ({edge.count} references, "
                            f"e.g. {edge.example})")
        elif level_of[b] == level_of[a]:
            breaches.append(f"map: {a} -> {b} joins two rooms of one level ({edge.count} "
                            f"references, e.g. {edge.example})")
    return breaches


# ---------------------------------------------------------------------------------------------
# The report.


def p90(values: list[int]) -> int:
    """The 90th percentile by nearest rank: the smallest value that 90 % of values stay within."""
    if not values:
        return 0
    ordered = sorted(values)
    return ordered[math.ceil(0.9 * len(ordered)) - 1]


def median(values: list[int]) -> float:
    return statistics.median(values) if values else 0


def describe_component(graph: Graph, component: list[str]) -> dict:
    inside = set(component)
    edges = [
        {"from": a, "to": b, "references": e.count, "example": e.example}
        for (a, b), e in sorted(graph.edges.items())
        if a in inside and b in inside
    ]
    return {"folder": graph.name, "nodes": component, "rings": graph.rings(component),
            "edges": edges}


def measure(root: Path, map_path: Path) -> dict:
    """Everything the report says, and the breaches."""
    tree = Tree(root)
    folders, rooms = build_graphs(tree)
    circles = [describe_component(g, c) for n, g in sorted(folders.items())
               for c in g.components()]
    cycles = [describe_component(rooms, c) for c in rooms.components()]
    levels, map_problem = read_map(map_path)
    breaches = [f"circle in {c['folder']} among {', '.join(c['nodes'])}" for c in circles]
    breaches += [f"module cycle among {', '.join(c['nodes'])}" for c in cycles]
    if map_problem is not None:
        breaches.append(f"map: {map_problem}")
    else:
        breaches += map_breaches(levels, rooms)
    files = file_summary([f for f in tree.files if f.area in SIZED_AREAS], tree.files)
    functions = function_summary([f for f in tree.functions if f.area in SIZED_AREAS],
                                 tree.functions)
    breaches += files.pop("breaches") + functions.pop("breaches")
    return {
        "files": files,
        "functions": functions,
        "circles": circles,
        "module_cycles": cycles,
        "map": levels,
        "room_arrows": [{"from": a, "to": b, "references": e.count, "example": e.example}
                        for (a, b), e in sorted(rooms.edges.items())],
        "warnings": tree.warnings,
        "breaches": breaches,
    }


def file_summary(files: list[SourceFile], every: list[SourceFile]) -> dict:
    """The limits over `files`; `every` file's lengths by area, for the report."""
    lengths = [f.lines for f in files]
    out = {
        "count": len(files),
        "median": median(lengths),
        "p90": p90(lengths),
        "by_area": area_stats([(f.area, f.lines) for f in every]),
        "longest": [{"file": f.rel, "lines": f.lines}
                    for f in sorted(files, key=lambda f: (-f.lines, f.rel))[:WORST_SHOWN]],
        "breaches": [],
    }
    if out["median"] > MAX_FILE_MEDIAN:
        out["breaches"].append(f"files: median {out['median']} lines > {MAX_FILE_MEDIAN}")
    if out["p90"] > MAX_FILE_P90:
        out["breaches"].append(f"files: p90 {out['p90']} lines > {MAX_FILE_P90}")
    return out


def function_summary(functions: list[Function], every: list[Function]) -> dict:
    """The limits over `functions`; `every` function's lengths by area, for the report."""
    lengths = [f.length for f in functions]
    too_long = sorted((f for f in functions if f.length > MAX_FN_LINES),
                      key=lambda f: (-f.length, f.rel, f.line))
    out = {
        "count": len(functions),
        "median": median(lengths),
        "p90": p90(lengths),
        "by_area": area_stats([(f.area, f.length) for f in every]),
        "too_long": [fn_json(f) for f in too_long],
        "longest": [fn_json(f) for f in sorted(functions, key=lambda f: (-f.length, f.rel,
                                                                         f.line))[:WORST_SHOWN]],
        "breaches": [f"function {f.rel}:{f.line} `{f.name}` is {f.length} lines > {MAX_FN_LINES}"
                     for f in too_long],
    }
    if out["p90"] > MAX_FN_P90:
        out["breaches"].append(f"functions: p90 {out['p90']} lines > {MAX_FN_P90}")
    return out


def fn_json(f: Function) -> dict:
    return {"file": f.rel, "line": f.line, "name": f.name, "lines": f.length}


def area_stats(pairs: list[tuple[str, int]]) -> dict:
    by_area: dict[str, list[int]] = {}
    for area, value in pairs:
        by_area.setdefault(area, []).append(value)
    return {a: {"count": len(v), "median": median(v), "p90": p90(v)}
            for a, v in sorted(by_area.items())}


def render(report: dict) -> str:
    """The report for a person."""
    out = []
    files, fns = report["files"], report["functions"]
    out.append(f"Files: {files['count']}, median {files['median']} lines (limit "
               f"{MAX_FILE_MEDIAN}), p90 {files['p90']} (limit {MAX_FILE_P90})")
    out += [f"  {a}: {s['count']} files, median {s['median']}, p90 {s['p90']}"
            for a, s in files["by_area"].items()]
    out.append("  longest: " + ", ".join(f"{f['file']} {f['lines']}" for f in files["longest"]))
    out.append(f"Functions: {fns['count']}, median {fns['median']} lines, p90 {fns['p90']} "
               f"(limit {MAX_FN_P90}), {len(fns['too_long'])} over {MAX_FN_LINES} lines")
    out += [f"  {a}: {s['count']} functions, median {s['median']}, p90 {s['p90']}"
            for a, s in fns["by_area"].items()]
    out.append("  longest:")
    out += [f"    {f['lines']:4} {f['file']}:{f['line']} {f['name']}" for f in fns["longest"]]
    out += render_components("Circles in folders", report["circles"])
    out += render_components("Module cycles", report["module_cycles"])
    out.append("Arrows between rooms (references):")
    out += [f"  {a['from']} -> {a['to']}: {a['references']}  e.g. {a['example']}"
            for a in report["room_arrows"]]
    out += [f"warning: {w}" for w in report["warnings"]]
    out.append(f"Breaches: {len(report['breaches'])}")
    out += [f"  {b}" for b in report["breaches"]]
    return "\n".join(out)


def render_components(title: str, components: list[dict]) -> list[str]:
    out = [f"{title}: {len(components)}"]
    for c in components:
        out.append(f"  {c['folder']}: {', '.join(c['nodes'])}")
        out += [f"    ring {' -> '.join(ring)}" for ring in c["rings"]]
        out += [f"    {e['from']} -> {e['to']} ({e['references']}): {e['example']}"
                for e in c["edges"]]
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--root", type=Path, default=ROOT, help="the repository to measure")
    parser.add_argument("--map", type=Path, help="the file with the map (ROOT/ARCHITECTURE.md)")
    parser.add_argument("--self-test", action="store_true", help="run this script's own tests")
    args = parser.parse_args(argv)
    if args.self_test:
        return self_test()
    root = args.root.resolve()
    report = measure(root, args.map or root / "ARCHITECTURE.md")
    print(json.dumps(report, indent=2) if args.json else render(report))
    return 1 if report["breaches"] else 0


def self_test() -> int:
    """Runs this script's tests, in tests/python/architecture_rules.py."""
    import unittest

    tests = Path(__file__).resolve().parent.parent / "tests" / "python"
    suite = unittest.defaultTestLoader.discover(str(tests), pattern="architecture_rules.py")
    result = unittest.TextTestRunner(verbosity=1).run(suite)
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
