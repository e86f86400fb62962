"""Counts of the codebase, the figures an outside review reads first, reproducible from a tree.

    .venv/bin/python scripts/code_counts.py                      # this checkout
    .venv/bin/python scripts/code_counts.py --mypy               # and mypy --strict over engine/ (slow)
    .venv/bin/python scripts/code_counts.py --root /tmp/old --mypy --json

For the packages engine, supervisor, rmqpy and harness (each, and in total), from `ast` and nothing
imported from them:
- modules and lines;
- the largest classes (lines, with their method counts);
- functions and methods over 44 and over 70 lines, from `def` to their last line;
- import circles: the strongly connected components of the module import graph, counting imports
  inside functions and type-only ones (a module that names another's types depends on it);
- up-arrows: imports that go up the package map, the layers of pyproject's import-linter contracts:
  harness > supervisor > engine, rmqpy importing neither supervisor nor harness, and inside the
  engine engine.actors > engine.services > engine.store | engine.ipc | engine.config > engine.codec >
  engine.codec_py > engine.layout. An import between two of engine.store, engine.ipc and
  engine.config goes sideways (the contracts keep them independent) and is counted apart. Each
  (importer, imported) pair counts once;
- with --mypy, the errors of `mypy --strict engine` under the tree's own pyproject.toml, and how
  many fall outside the modules that pyproject already holds strict (its override that sets
  disallow_untyped_defs).
Lists are sorted with ties broken by name, so the same tree prints the same figures.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import subprocess
import sys
import tempfile
import tomllib
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PACKAGES = ("engine", "supervisor", "rmqpy", "harness")
LONG_LINES = 44
VERY_LONG_LINES = 70
TOP = 10
# The package map as layers, higher imports lower. Top level first, then inside the engine; a module
# takes the rank of the longest layer name it starts with.
TOP_LAYERS = {"harness": 3, "supervisor": 2, "engine": 1}
ENGINE_LAYERS = {
    "engine.actors": 6,
    "engine.services": 5,
    "engine.store": 4,
    "engine.ipc": 4,
    "engine.config": 4,
    "engine.codec": 3,
    "engine.codec_py": 2,
    "engine.layout": 1,
}
FORBIDDEN = {"rmqpy": ("supervisor", "harness")}


@dataclass(frozen=True)
class Span:
    """A class or a function: where it is and how long it runs."""

    name: str
    lines: int
    methods: int = 0


@dataclass(frozen=True)
class Import:
    """A name one import statement brings in (resolve() finds the module it is), and its line."""

    imported: str
    line: int


@dataclass(frozen=True)
class Arrow:
    """An import against the package map: 'up' a layer, or 'sideways' between independent ones."""

    importer: str
    imported: str
    line: int
    direction: str


@dataclass
class Module:
    name: str
    path: Path
    lines: int
    classes: list[Span] = field(default_factory=list)
    functions: list[Span] = field(default_factory=list)
    imports: list[Import] = field(default_factory=list)

    @property
    def package(self) -> str:
        return package_of(self.name)


def package_of(module: str) -> str:
    return module.partition(".")[0]


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def span_lines(node: ast.stmt) -> int:
    assert node.end_lineno is not None
    return node.end_lineno - node.lineno + 1


class Walker(ast.NodeVisitor):
    """Collects the classes, functions (qualified by what encloses them) and imports of one module."""

    def __init__(self, module: Module) -> None:
        self.module = module
        self.scope: list[str] = []

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        methods = sum(isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) for child in node.body)
        self.module.classes.append(Span(self.qualified(node.name), span_lines(node), methods))
        self.enter(node)

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.module.functions.append(Span(self.qualified(node.name), span_lines(node)))
        self.enter(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.module.imports.append(Import(alias.name, node.lineno))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = node.module or ""
        if node.level:
            package = self.module.name.split(".")
            if self.module.path.name != "__init__.py":
                package.pop()
            package = package[: len(package) - node.level + 1]
            base = ".".join([*package, base] if base else package)
        for alias in node.names:
            # `from package import name` imports the submodule when there is one; resolve() decides.
            self.module.imports.append(Import(f"{base}.{alias.name}", node.lineno))

    def qualified(self, name: str) -> str:
        return f"{self.module.name}:{'.'.join([*self.scope, name])}"

    def enter(self, node: ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()


def read_modules(root: Path) -> dict[str, Module]:
    modules: dict[str, Module] = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            module = Module(module_name(root, path), path, len(text.splitlines()))
            Walker(module).visit(ast.parse(text, filename=str(path)))
            modules[module.name] = module
    return modules


def resolve(name: str, modules: dict[str, Module]) -> str | None:
    """The module an import names: the longest prefix of `name` that is one of ours (None: outside)."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def import_graph(modules: dict[str, Module]) -> dict[str, dict[str, int]]:
    """importer -> imported -> the first line that imports it; a module importing itself is left out."""
    graph: dict[str, dict[str, int]] = {name: {} for name in modules}
    for module in modules.values():
        for imp in module.imports:
            target = resolve(imp.imported, modules)
            if target is not None and target != module.name:
                graph[module.name].setdefault(target, imp.line)
    return graph


def circles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan's, without recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return sorted(found, key=lambda c: (-len(c), c))


def shortest_cycle(graph: dict[str, dict[str, int]], component: list[str]) -> list[str]:
    """One shortest way round the circle from its first module, to print beside the members."""
    start, members = component[0], set(component)
    before: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for nxt in sorted(graph[node]):
            if nxt == start:
                path = [node]
                while path[-1] != start:
                    path.append(before[path[-1]])
                return [*reversed(path), start]
            if nxt in members and nxt not in before:
                before[nxt] = node
                queue.append(nxt)
    raise AssertionError(f"no way round the circle of {start}")


def layer(module: str, layers: dict[str, int]) -> str | None:
    names = [name for name in layers if module == name or module.startswith(name + ".")]
    return max(names, key=len) if names else None


def arrow(importer: str, imported: str) -> str | None:
    """'up' or 'sideways' when the import goes against the package map, else None."""
    source, target = package_of(importer), package_of(imported)
    if target in FORBIDDEN.get(source, ()):
        return "up"
    if source != target:
        return "up" if TOP_LAYERS.get(target, 0) > TOP_LAYERS.get(source, 99) else None
    low, high = layer(importer, ENGINE_LAYERS), layer(imported, ENGINE_LAYERS)
    if low is None or high is None or low == high:
        return None
    if ENGINE_LAYERS[high] > ENGINE_LAYERS[low]:
        return "up"
    return "sideways" if ENGINE_LAYERS[high] == ENGINE_LAYERS[low] else None


def strict_patterns(pyproject: Path) -> list[str]:
    """The module patterns of the override that holds modules to --strict's flags."""
    config = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    overrides = config.get("tool", {}).get("mypy", {}).get("overrides", [])
    strict = [o for o in overrides if o.get("disallow_untyped_defs")]
    modules = [m for o in strict for m in ([o["module"]] if isinstance(o["module"], str) else o["module"])]
    return sorted(modules)


def held_strict(module: str, patterns: list[str]) -> bool:
    # mypy's `pkg.*` matches pkg itself and everything under it.
    return any(
        module == p or (p.endswith(".*") and (module == p[:-2] or module.startswith(p[:-1]))) for p in patterns
    )


ERROR_LINE = re.compile(r"^(?P<path>[^:]+\.pyi?):\d+(?::\d+)?: error:")


def mypy_errors(root: Path, python: str, config: Path) -> dict[str, Any]:
    """Runs `mypy --strict engine` in `root` and sorts its errors by module, strict-held or not."""
    cache = Path(tempfile.gettempdir()) / "code_counts_mypy" / re.sub(r"\W", "_", str(root.resolve()))
    command = [python, "-m", "mypy", "--strict", "--config-file", str(config), "--cache-dir", str(cache), "engine"]
    run = subprocess.run(command, cwd=root, capture_output=True, text=True, check=False)
    patterns = strict_patterns(config)
    per_module: Counter[str] = Counter()
    for line in run.stdout.splitlines():
        if " error:" not in line:
            continue
        match = ERROR_LINE.match(line)
        path = (root / match["path"]).resolve() if match else None
        per_module[module_name(root, path) if path and path.is_relative_to(root) else "(outside the tree)"] += 1
    outside = Counter({m: n for m, n in per_module.items() if not held_strict(m, patterns)})
    by_package: Counter[str] = Counter()
    for module, number in per_module.items():
        by_package[package_of(module)] += number
    if run.returncode not in (0, 1):
        raise SystemExit(f"mypy failed ({run.returncode}): {run.stderr or run.stdout[-2000:]}")
    return {
        "command": f"mypy --strict --config-file {config} engine (in {root})",
        "errors": sum(per_module.values()),
        "errors_outside_strict_modules": sum(outside.values()),
        "strict_modules": patterns,
        "outside_by_module": dict(sorted(outside.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP]),
        "by_package": dict(sorted(by_package.items())),
    }


def revision(root: Path) -> str:
    """The commit a git checkout stands on, and whether the counted files differ from it (the counts read the files)."""
    if not (root / ".git").exists():
        return "not a git checkout"
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          check=False)
    changed = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", *PACKAGES], capture_output=True,
                             text=True, check=False)
    if head.returncode or changed.returncode:
        return "git could not say which commit"
    return f"commit {head.stdout.strip()}" + (", with uncommitted changes" if changed.stdout.strip() else "")


def top(spans: list[Span]) -> list[Span]:
    return sorted(spans, key=lambda s: (-s.lines, s.name))[:TOP]


def counts(root: Path) -> dict[str, Any]:
    modules = read_modules(root)
    graph = import_graph(modules)
    found = circles(graph)
    arrows = [
        Arrow(importer, imported, line, direction)
        for importer in sorted(graph)
        for imported, line in sorted(graph[importer].items())
        if (direction := arrow(importer, imported))
    ]
    rows: dict[str, dict[str, int]] = {}
    for package in [*PACKAGES, "total"]:
        members = [m for m in modules.values() if package in ("total", m.package)]
        functions = [f for m in members for f in m.functions]
        rows[package] = {
            "modules": len(members),
            "lines": sum(m.lines for m in members),
            "classes": sum(len(m.classes) for m in members),
            "functions": len(functions),
            f"over_{LONG_LINES}": sum(f.lines > LONG_LINES for f in functions),
            f"over_{VERY_LONG_LINES}": sum(f.lines > VERY_LONG_LINES for f in functions),
            "circles": sum(package in ("total", package_of(c[0])) for c in found),
            "up_arrows": sum(package in ("total", package_of(a.importer)) and a.direction == "up" for a in arrows),
            "sideways": sum(package in ("total", package_of(a.importer)) and a.direction == "sideways" for a in arrows),
        }
    functions = [f for m in modules.values() for f in m.functions]
    return {
        "root": str(root),
        "revision": revision(root),
        "packages": rows,
        "largest_classes": [vars(s) for s in top([c for m in modules.values() for c in m.classes])],
        f"longest_functions_over_{LONG_LINES}": [
            {"name": s.name, "lines": s.lines} for s in top([f for f in functions if f.lines > LONG_LINES])
        ],
        "circles": [{"modules": c, "example": shortest_cycle(graph, c)} for c in found],
        "arrows": [vars(a) for a in arrows],
    }


def table(result: dict[str, Any]) -> str:
    columns = ["modules", "lines", "classes", "functions", f"over_{LONG_LINES}", f"over_{VERY_LONG_LINES}",
               "circles", "up_arrows", "sideways"]
    out = [f"code counts of {result['root']} ({result['revision']})", ""]
    out.append(f"{'package':<12}" + "".join(f"{c.replace('_', ' '):>11}" for c in columns))
    for package, row in result["packages"].items():
        out.append(f"{package:<12}" + "".join(f"{row[c]:>11}" for c in columns))
    out.append("(circles: by the package of a circle's first module; arrows: by the importer's package)")
    out += ["", f"largest classes (top {TOP}):"]
    out += [f"  {s['lines']:>5} lines {s['methods']:>4} methods  {s['name']}" for s in result["largest_classes"]]
    total = result["packages"]["total"]
    out += ["", f"functions over {LONG_LINES} lines: {total[f'over_{LONG_LINES}']}, over {VERY_LONG_LINES}: "
            f"{total[f'over_{VERY_LONG_LINES}']}; the longest:"]
    out += [f"  {s['lines']:>5} lines  {s['name']}" for s in result[f"longest_functions_over_{LONG_LINES}"]]
    members = sum(len(c["modules"]) for c in result["circles"])
    out += ["", f"import circles: {len(result['circles'])} ({members} modules in them)"]
    for number, circle in enumerate(result["circles"], 1):
        out.append(f"  {number}. {len(circle['modules'])} modules: {', '.join(circle['modules'])}")
        out.append(f"     e.g. {' -> '.join(circle['example'])}")
    for direction, title in (("up", "up-arrows (imports up the package map)"),
                             ("sideways", "sideways imports (between engine.store, engine.ipc and engine.config)")):
        listed = [a for a in result["arrows"] if a["direction"] == direction]
        out += ["", f"{title}: {len(listed)}"]
        out += [f"  {a['importer']}:{a['line']} -> {a['imported']}" for a in listed]
    if "mypy" in result:
        mypy = result["mypy"]
        out += ["", f"{mypy['command']}: {mypy['errors']} errors, "
                f"{mypy['errors_outside_strict_modules']} outside the modules held strict",
                "  by package: " + ", ".join(f"{p} {n}" for p, n in mypy["by_package"].items()),
                f"  most outside the strict modules (top {TOP}):"]
        out += [f"  {n:>5}  {m}" for m, n in mypy["outside_by_module"].items()]
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent,
                        help="the tree to count (default: this checkout)")
    parser.add_argument("--mypy", action="store_true", help="also count mypy --strict errors over engine/")
    parser.add_argument("--python", default=sys.executable, help="the interpreter that runs mypy")
    parser.add_argument("--config-file", type=Path, help="mypy's config (default: ROOT/pyproject.toml)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    args = parser.parse_args()
    root = args.root.resolve()
    result = counts(root)
    if args.mypy:
        result["mypy"] = mypy_errors(root, args.python, (args.config_file or root / "pyproject.toml").resolve())
    print(json.dumps(result, indent=2) if args.json else table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
