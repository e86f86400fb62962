"""Every path and code name the docs mention in backticks exists: a doc that names a function that
does not exist (or a file that moved) is a bug the reader pays for, and this test finds it.

The docs are README.md and docs/*.md; each inline backticked span (fenced blocks aside) is read
as one of these, or left alone:

* a path of this repository: it begins with one of the repository's top-level folders
  (``engine/``, ``docs/``, ``.ci/``, ...) or is a top-level file (``Makefile``), with an
  optional ``:name``/``::name`` suffix or a trailing ``/``; the path must exist, and for a
  ``.py`` file the suffix (``Class.method``, or pytest's ``Class::test``) must be defined in it.
  Patterns (``*``, ``{topic}``, ``<k>``) are skipped;
* ``module.py:name``: some Python source of that file name defines ``name``;
* ``Class.method`` (``Class`` capitalized): a class of that name has, or inherits from a class
  of the sources, a ``def``, a class attribute or an attribute its methods assign on ``self``;
* ``function()`` or ``Class.method()``: the same, with a bare name defined somewhere;
* a dotted name that begins with a package of this repository (``engine.ipc.channels``): the
  module exists and the rest is defined in it.

Not project code, and so not checked: RocketMQ's Java (``CommitLog.java``, and a ``Class.method``
whose method is camelCase, as Java's are: ``DefaultMessageStore.putMessage``), a few classes of
the JDK and of Python's library (``OTHER_CLASSES``), calls that Python's builtins, ``os`` or
PromQL define (``fsync()``, ``rate()``), and ``NAME.key``-like file patterns. Any other
``Class.member`` must name a class of ours. "Defined somewhere" means in the Python sources of
the engine, the supervisor, rmqpy, the harness, the scripts and the tests (``SOURCES``).
"""

from __future__ import annotations

import ast
import builtins
import os
import re
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)  # parses every Python source once: seconds, more on a busy machine

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SOURCES = ("engine", "supervisor", "rmqpy", "harness", "scripts", "tests")  # folders, and packages of dotted names
# Folders at the top that are no part of the sources: the virtualenv, the build's metadata.
NOT_SOURCES = {".venv", ".git", ".import_linter_cache", "rmqpy_store.egg-info", "__pycache__", ".pytest_cache",
               ".mypy_cache", ".ruff_cache", "build", "dist"}

SPAN = re.compile(r"(?<!`)`((?:[^`\n]|\n(?!\s*\n))+)`(?!`)")  # may go on to the next line, not past a paragraph
FENCE = re.compile(r"^\s*(```|~~~)")
PATTERN = re.compile(r"[*{}<>\[\]]|\.\.\.|…")  # a glob or a placeholder: no one file
IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"
CLASS_MEMBER = re.compile(rf"^([A-Z][A-Za-z0-9_]*)\.({IDENTIFIER})(\(\))?$")
CALL = re.compile(rf"^({IDENTIFIER})\(\)$")
FILE_NAME = re.compile(rf"^({IDENTIFIER}\.py):({IDENTIFIER}(?:\.{IDENTIFIER})?)$")
DOTTED = re.compile(rf"^(?:{'|'.join(SOURCES)})(?:\.{IDENTIFIER})+$")
RUN_MODULE = re.compile(r"python -m (\S+)")
PROMQL = {"rate", "increase", "histogram_quantile"}  # docs/metrics.md's queries: Prometheus's functions
# Classes of other code whose members the docs name: the JDK's and the Python library's. A Java
# method in camelCase needs no entry (``String.hashCode``, ``DefaultMessageStore.putMessage``).
OTHER_CLASSES = {"FileChannel", "Popen"}
PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*$")  # NAME in `NAME.key`: a file name's pattern
CAMEL = re.compile(r"^[a-z]+[A-Z]")  # Java's methods: putMessage, doReput


@dataclass
class Definitions:
    """What the Python sources define: per file and over all of them."""

    names: set[str] = field(default_factory=set)  # any def, class or assignment, at any depth
    by_file: dict[Path, set[str]] = field(default_factory=dict)  # "name" and "Class.member", per file
    members: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))  # class -> its members
    bases: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))  # class -> its bases' names
    file_names: dict[str, list[Path]] = field(default_factory=lambda: defaultdict(list))  # "x.py" -> files

    def class_has(self, cls: str, member: str, seen: frozenset[str] = frozenset()) -> bool:
        if member in self.members.get(cls, ()):
            return True
        return any(self.class_has(base, member, seen | {cls}) for base in self.bases.get(cls, ()) if base not in seen)


def _targets(node: ast.AST) -> Iterator[ast.expr]:
    if isinstance(node, ast.Assign):
        yield from node.targets
    elif isinstance(node, ast.AnnAssign | ast.AugAssign):
        yield node.target


def _flat(target: ast.expr) -> Iterator[ast.expr]:
    if isinstance(target, ast.Tuple | ast.List):
        for element in target.elts:
            yield from _flat(element)
    else:
        yield target


def _class_members(cls: ast.ClassDef) -> set[str]:
    """Its defs and class attributes, and what any of its methods assigns on ``self``."""
    members = set()
    for node in cls.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            members.add(node.name)
        for target in _targets(node):
            members.update(t.id for t in _flat(target) if isinstance(t, ast.Name))
    for node in ast.walk(cls):
        for target in _targets(node):
            for t in _flat(target):
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                    members.add(t.attr)
    return members


@cache
def definitions() -> Definitions:
    found = Definitions()
    for folder in SOURCES:
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_bytes(), filename=str(path))
            here = set()
            for node in ast.walk(tree):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    here.add(node.name)
                if isinstance(node, ast.ClassDef):
                    members = _class_members(node)
                    found.members[node.name] |= members
                    here.update(f"{node.name}.{member}" for member in members)
                    found.bases[node.name].update(
                        base.id if isinstance(base, ast.Name) else base.attr
                        for base in node.bases if isinstance(base, ast.Name | ast.Attribute))
                for target in _targets(node):
                    here.update(t.id for t in _flat(target) if isinstance(t, ast.Name))
                if isinstance(node, ast.ImportFrom | ast.Import):  # re-exported names count as the module's
                    here.update(alias.asname or alias.name.split(".")[0] for alias in node.names)
            found.by_file[path] = here
            found.names |= here
            found.file_names[path.name].append(path)
    return found


def top_level() -> tuple[set[str], set[str]]:
    """The repository's top-level folders and files (hidden ones aside, but ``.ci``)."""
    folders, files = set(), set()
    for entry in ROOT.iterdir():
        if entry.name in NOT_SOURCES or (entry.name.startswith(".") and entry.name != ".ci"):
            continue
        (folders if entry.is_dir() else files).add(entry.name)
    return folders, files


def _python_name_defined(path: Path, name: str) -> bool:
    """``name`` (``f``, ``Class.method``, pytest's ``Class::test``) is defined in ``path``."""
    defs = definitions()
    name = name.replace("::", ".")
    cls, _, member = name.rpartition(".")
    if name in defs.by_file.get(path, ()):
        return True
    return bool(cls) and cls in defs.by_file.get(path, ()) and defs.class_has(cls, member)


def check_path(span: str) -> str | None:
    """The reason a repository path span is wrong, or None (right, or not a path of ours)."""
    folders, files = top_level()
    span = span.split(" ", 1)[0]  # a command's arguments aside: `scripts/simulate.py --seed N`
    path, sep, name = span.partition("::") if "::" in span else span.partition(":")
    first = path.split("/", 1)[0]
    if not ((first in folders and "/" in path) or path in files) or PATTERN.search(path):
        return None
    target = ROOT / path.rstrip("/")
    if not target.exists():
        return "no such path"
    python_name = sep and target.suffix == ".py" and re.fullmatch(rf"{IDENTIFIER}((\.|::){IDENTIFIER})*", name)
    if python_name and not _python_name_defined(target, name):
        return f"{name} is not defined in {path}"
    return None


def _check_file_name(match: re.Match[str]) -> str | None:
    """``module.py:name``: some source of that file name defines ``name``."""
    file_name, name = match.groups()
    paths = definitions().file_names.get(file_name)
    if not paths:
        return f"no Python source is named {file_name}"
    return None if any(_python_name_defined(path, name) for path in paths) else f"{name} is not in any {file_name}"


def _check_class_member(match: re.Match[str]) -> str | None:
    """``Class.member``: a class of ours has it, unless the class is other code's."""
    cls, member, _call = match.groups()
    defs = definitions()
    if cls in OTHER_CLASSES or CAMEL.match(member) or PLACEHOLDER.match(cls):
        return None
    if cls not in defs.members:
        return f"no class named {cls}"
    return None if defs.class_has(cls, member) else f"{cls} has no {member}"


def _check_call(match: re.Match[str]) -> str | None:
    """``function()``: defined somewhere, unless Python's builtins, ``os`` or PromQL have it."""
    name = match.group(1)
    if name in definitions().names or name in PROMQL or hasattr(builtins, name) or hasattr(os, name):
        return None
    return f"no def, class or assignment named {name}"


def _check_run_module(match: re.Match[str]) -> str | None:
    """``python -m engine.ipc.channels ...``: the module exists (``<module>`` is a placeholder)."""
    module = match.group(1)
    if PATTERN.search(module) or _module_file(module.split(".")):
        return None
    return "no such module"


def check_code_name(span: str) -> str | None:
    """The reason a code-name span is wrong, or None (defined, or not ours to check)."""
    if span.endswith(".java"):
        return None
    for pattern, check in ((FILE_NAME, _check_file_name), (CLASS_MEMBER, _check_class_member), (CALL, _check_call),
                           (RUN_MODULE, _check_run_module), (DOTTED, _check_dotted)):
        if match := pattern.match(span):
            return check(match)
    return None


def _module_file(parts: list[str]) -> Path | None:
    """The file of the module ``parts`` names (a package's ``__init__.py``; a compiled module's
    C source, ``engine/_codec.c``, as the build may not have run), or None."""
    base = ROOT.joinpath(*parts)
    for path in (base.with_suffix(".py"), base / "__init__.py", base.with_suffix(".c")):
        if path.exists():
            return path
    return None


def _check_dotted(match: re.Match[str]) -> str | None:
    """``engine.client`` or ``engine.client.StoreClient``: the longest module, then the names in it.
    A package and a name that is no module of it (``engine.ready``, an event; ``supervisor.json``,
    a file) is not a module path and is left alone."""
    parts = match.group(0).split(".")
    for cut in range(len(parts), 1, -1):
        module = _module_file(parts[:cut])
        if module is not None:
            rest = ".".join(parts[cut:])
            if rest and module.suffix == ".py" and not _python_name_defined(module, rest):
                return f"{rest} is not defined in {module.relative_to(ROOT)}"
            return None
    return None


def doc_spans(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, span) of each inline code span outside fenced blocks; a span broken over two
    lines is read as one, its line break a space."""
    lines, fenced = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        fence = bool(FENCE.match(line))
        fenced ^= fence
        lines.append("" if fenced or fence else line)  # a fenced block's lines stay, empty: numbers hold
    text = "\n".join(lines)
    for match in SPAN.finditer(text):
        yield text.count("\n", 0, match.start()) + 1, " ".join(match.group(1).split())


def stale_references() -> list[str]:
    stale = []
    for doc in DOCS:
        for number, span in doc_spans(doc):
            reason = check_path(span) or check_code_name(span)
            if reason:
                stale.append(f"{doc.relative_to(ROOT)}:{number}: `{span}`: {reason}")
    return stale


def test_every_path_and_code_name_the_docs_mention_exists() -> None:
    stale = stale_references()
    assert not stale, "the docs name what does not exist:\n" + "\n".join(stale)
