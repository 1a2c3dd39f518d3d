"""Print lad's structure figures: units, import loops, layers, module sizes, total lines.

    python tools/structure.py [--json]

A unit is a subpackage of `lad/` (all of its modules together) or a top-level module. Every
`import lad…` / `from lad… import` statement counts, also inside functions. A unit's layer is 1
plus the highest layer of the units it imports; units in one import loop share a layer and the
loop is listed.

Two figures check "one concept, one place" (docs/architecture.md):
- run-directory names outside RunDir: string constants elsewhere in lad/ that are the name of a
  file of a run directory (the .json/.jsonl names lad/run/rundir.py declares); 0 means every
  name and write of a run directory goes through lad.run.rundir.RunDir.
- input reads: the calls that parse an input or decide from one (`read_items`, `get_scheme`,
  `vanilla_template`), counted by function outside the module that defines each, with the files.

And three of size and surface:
- lines per capability: lad/'s lines split into the features lad had at commit 696e84e and
  each capability added since (CAPABILITIES: its modules, and the lines its commits added to
  the other modules that are still there, by git blame), so a round's growth is measured apart
  from the old features' size. Issue 43's guarantees (refusals, confinement and bounds for the
  features added since) are this round's work and count apart, as a capability with no module of
  its own; stops 52 and 53's defect fixes harden the old features and count with them, their sizes
  shown (SHOWN_APART).
- Backend's public methods (lad.backends.hf.Backend: those without a leading underscore).
- private names imported from another module of lad (`from lad.x import _name`), with where.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "lad"
MAX_MODULE_LINES = 500
RUNDIR = ROOT / "run" / "rundir.py"
INPUT_READS = {  # function: the module defining it
    "read_items": "lad/data/items.py",
    "get_scheme": "lad/core/labels.py",
    "vanilla_template": "lad/core/prompts.py",
}
# The capabilities added since commit 696e84e: each one's modules (paths below lad/, globs), and
# the commits that brought it, whose lines still in the old modules count with it (see
# capability_lines).
CAPABILITIES = {
    "vLLM engine": (
        (
            "backends/vllm_engine.py",
            "backends/vllm_capture.py",
            "backends/engines.py",
            "testing/shrunk.py",  # the shrunk real checkpoints its tests compare the engines on
        ),
        ("7b5bfea", "fdd673b", "cc90eee", "bd9b531"),
    ),
    "lad serve": (("run/serve.py", "cli/serve.py"), ("4cd1d21", "aa294e3")),
    "blank method": (("core/blank.py", "data/blank.py"), ("f2c35eb", "204701d")),
    "Facet-Probe export": (("outputs/export.py", "cli/export.py"), ("75b2c4f",)),
    "order screen": (("data/screen.py",), ()),
    "Inspect harness": (
        ("harness/inspect_*.py",),
        ("e448d2f", "bd00838", "0e41252", "edab0d3", "4f14e96"),
    ),
    "Qwen3-VL and Qwen3.5": (
        ("testing/tiny_qwen.py",),
        ("88579fe", "4fec6b2", "910e1ba", "9a4faff"),
    ),
    "text demo": (("demo/text.py",), ("7310f73", "ce00996")),
    "LLaVA-OneVision-1.5 (remote code)": (
        ("backends/remote.py", "backends/spans.py", "testing/remote.py"),
        ("4c921f9", "e7dd3da", "2c6284d", "477729b"),
    ),
    "issue 43's guarantees": (
        (),  # rules in lad/io and RunDir, spread over the old modules: its commits' lines
        ("4c0a572", "de4adc5", "c322f0c", "291a49d", "8a44d26", "a198c5d", "db521e8"),
    ),
}
# Shown apart but counted with the old features, since they fix what lad had: the defects hostile
# reads of lad found at stops 52 and 53 (each commit's message says which).
SHOWN_APART = {
    "stop 52's defect fixes": (
        "6fd1f91", "e4811b3", "0acbe1d", "fcb6688", "2050efd", "577df33", "48435ca", "740f6a9",
        "38ac327", "d7a96b7", "8b8d3bc", "5b7ef89", "99d387b",
    ),
    "stop 53's defect fixes": (
        "c26a3a9", "cf381a4", "9d5aab5", "0216f81", "8712b9a", "137eb45", "98e986a", "8c07f22",
    ),
}  # fmt: skip
BACKEND = ROOT / "backends" / "hf.py"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def unit_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "lad/__init__.py"
    sub = ROOT / parts[1]
    return f"lad/{parts[1]}/" if sub.is_dir() else f"lad/{parts[1]}.py"


def imported_modules(path: Path, module: str) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    skipped = {  # imports for type annotations only never run
        id(inner)
        for node in ast.walk(tree)
        if _type_checking_only(node)
        for inner in ast.walk(node)
    }
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "lad"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            if name.split(".")[0] == "lad":
                found.add(name)
                found |= {f"{name}.{a.name}" for a in node.names if resolves(f"{name}.{a.name}")}
    return found


def _type_checking_only(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and ast.unparse(node.test) in {
        "TYPE_CHECKING",
        "typing.TYPE_CHECKING",
    }


def resolves(module: str) -> bool:
    rel = Path(*module.split(".")[1:])
    return (ROOT / rel).with_suffix(".py").is_file() or (ROOT / rel / "__init__.py").is_file()


def strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            out.append(comp)

    sys.setrecursionlimit(10_000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _strings(tree: ast.AST) -> list[ast.Constant]:
    """A module's string constants, docstrings left out."""
    docs = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
    ]


def run_file_names() -> set[str]:
    """The file names of a run directory, as lad/run/rundir.py declares them."""
    tree = ast.parse(RUNDIR.read_text(encoding="utf-8"))
    names = {c.value for c in _strings(tree)}
    return {n for n in names if n.endswith((".json", ".jsonl")) and n[0].isalpha() and " " not in n}


def run_names_outside(files: list[Path]) -> list[str]:
    """file:line of each run-directory file name written outside rundir.py."""
    names, out = run_file_names(), []
    for p in files:
        if p in (RUNDIR, RUNDIR.with_name("runjson.py")):  # run.json's format is RunDir's
            continue
        for c in _strings(ast.parse(p.read_text(encoding="utf-8"))):
            if c.value in names:
                out.append(f"{p.relative_to(ROOT.parent)}:{c.lineno} {c.value}")
    return out


def input_reads(files: list[Path]) -> dict[str, list[str]]:
    """For each INPUT_READS function, file:line of every call outside its own module."""
    out: dict[str, list[str]] = {name: [] for name in INPUT_READS}
    for p in files:
        rel = str(p.relative_to(ROOT.parent))
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            name = (
                f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            )
            if name in INPUT_READS and INPUT_READS[name] != rel:
                out[name].append(f"{rel}:{node.lineno}")
    return out


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(ROOT.parent), *args], capture_output=True, text=True, check=True
    ).stdout


def commit_lines(files: list[str], commits: dict[str, str]) -> dict[str, int] | None:
    """Lines of `files` that each group of `commits` (full hash -> group) brought and that are
    still there: per (commit, file), the lines git blame gives the commit, at most the commit's
    net growth of that file (a commit that rewrote old lines is credited with what it added).
    None without git history (a shallow or exported tree)."""
    try:
        full = {_git("rev-parse", c).strip(): g for c, g in commits.items()}
    except (OSError, subprocess.CalledProcessError):
        return None
    blamed: Counter[tuple[str, str]] = Counter()
    for f in files:
        try:
            porcelain = _git("blame", "--line-porcelain", "-w", "-M", "-C", "--", f)
        except subprocess.CalledProcessError:  # a module git does not track yet: no commit's
            continue
        commit = ""
        for line in porcelain.split("\n"):
            head = line.split(" ")
            if len(head[0]) == 40 and len(head) >= 3:
                commit = head[0]
            elif line.startswith("filename ") and commit in full:
                blamed[(commit, line[len("filename ") :])] += 1
    out: Counter[str] = Counter({g: 0 for g in full.values()})
    for commit in {c for c, _ in blamed}:
        growth = {}
        for row in _git("show", "--numstat", "--no-renames", "--format=", commit).splitlines():
            added, deleted, path = row.split("\t")
            if added != "-":
                growth[path] = int(added) - int(deleted)
        for (c, path), n in blamed.items():
            if c == commit:
                out[full[c]] += max(0, min(n, growth.get(path, 0)))
    return dict(out)


def capability_lines(lines: dict[str, int]) -> dict[str, int | None]:
    """Lines of each capability: its modules, and its commits' lines still in the other modules
    (commit_lines); "old features": the rest of lad/, of which SHOWN_APART's groups are shown
    apart. Without git history only the modules count (the commits' lines read as None)."""
    modules = {}
    for name, (globs, _) in CAPABILITIES.items():
        modules[name] = {str(p.relative_to(ROOT.parent)) for g in globs for p in ROOT.glob(g)}
    new = set().union(*modules.values())
    old = sorted(p for p in lines if p not in new)
    groups = {c: name for name, (_, commits) in CAPABILITIES.items() for c in commits}
    groups.update({c: name for name, commits in SHOWN_APART.items() for c in commits})
    brought = commit_lines(old, groups)
    sizes: dict[str, int | None] = {}
    in_old = 0
    for name, paths in modules.items():
        extra = (brought or {}).get(name, 0)
        in_old += extra
        sizes[name] = sum(lines[p] for p in paths) + extra
    total_old = sum(lines[p] for p in old) - in_old
    apart = {f"of which {name}": (brought or {}).get(name) for name in SHOWN_APART}
    return {"old features": total_old, **apart, **sizes}


def backend_public_methods() -> list[str]:
    tree = ast.parse(BACKEND.read_text(encoding="utf-8"))
    (backend,) = (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Backend")
    return [
        n.name
        for n in backend.body
        if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")
    ]


def private_imports(files: list[Path]) -> list[str]:
    """`from lad.x import _name` statements (outside the package's own __init__), as
    "file:line name"."""
    found = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("lad"):
                for alias in node.names:
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        where = path.relative_to(ROOT.parent)
                        found.append(f"{where}:{node.lineno} {alias.name}")
    return found


def measure() -> dict:
    files = sorted(p for p in ROOT.rglob("*.py"))
    lines = {
        str(p.relative_to(ROOT.parent)): len(p.read_text(encoding="utf-8").splitlines())
        for p in files
    }
    graph: dict[str, set[str]] = {}
    for p in files:
        mod = module_name(p)
        unit = unit_of(mod)
        graph.setdefault(unit, set())
        for target in imported_modules(p, mod):
            other = unit_of(target)
            if other != unit and target != "lad":
                graph[unit].add(other)
            elif target == "lad" and unit != "lad/__init__.py":
                graph[unit].add("lad/__init__.py")
    for deps in list(graph.values()):
        for d in deps:
            graph.setdefault(d, set())
    comps = strongly_connected(graph)
    comp_of = {u: i for i, c in enumerate(comps) for u in c}
    layer: dict[int, int] = {}
    for i, comp in enumerate(comps):  # Tarjan yields components in reverse topological order
        below = [layer[comp_of[d]] for u in comp for d in graph[u] if comp_of[d] != i]
        layer[i] = 1 + max(below, default=0)
    loops = [sorted(c) for c in comps if len(c) > 1]
    big = {k: v for k, v in lines.items() if v > MAX_MODULE_LINES}
    return {
        "units": len(graph),
        "import_loops": loops,
        "units_in_loops": sum(len(c) for c in loops),
        "layers": max(layer.values()),
        "layer_of_unit": {
            u: layer[comp_of[u]] for u in sorted(graph, key=lambda u: (layer[comp_of[u]], u))
        },
        "modules_over_500_lines": big,
        "total_lines": sum(lines.values()),
        "modules": len(files),
        "run_names_outside_rundir": run_names_outside(files),
        "input_reads": input_reads(files),
        "lines_per_capability": capability_lines(lines),
        "backend_public_methods": backend_public_methods(),
        "private_imports": private_imports(files),
    }


def main() -> None:
    m = measure()
    if "--json" in sys.argv:
        print(json.dumps(m, indent=2))
        return
    print(f"lad/: {m['total_lines']:,} lines in {m['modules']} modules, {m['units']} units")
    print(f"import loops: {len(m['import_loops'])} ({m['units_in_loops']} units)")
    for loop in m["import_loops"]:
        print("  loop: " + ", ".join(loop))
    print(f"import layers: {m['layers']}")
    by_layer: dict[int, list[str]] = {}
    for unit, layer in m["layer_of_unit"].items():
        by_layer.setdefault(layer, []).append(unit)
    for layer in sorted(by_layer, reverse=True):
        print(f"  {layer:2d}  " + "  ".join(by_layer[layer]))
    print(f"modules over {MAX_MODULE_LINES} lines: {len(m['modules_over_500_lines'])}")
    for k, v in sorted(m["modules_over_500_lines"].items(), key=lambda kv: -kv[1]):
        print(f"  {k} {v}")
    outside = m["run_names_outside_rundir"]
    print(f"run-directory file names outside lad/run/rundir.py: {len(outside)}")
    for where in outside:
        print(f"  {where}")
    print("input reads (calls outside the defining module):")
    for name, calls in m["input_reads"].items():
        where = sorted({c.rpartition(":")[0] for c in calls})
        print(f"  {name}: {len(calls)} calls in {len(where)} files: {', '.join(where)}")
    print("lines per capability (old features: lad/ at 696e84e's features; the rest added since):")
    for name, count in m["lines_per_capability"].items():
        print(f"  {'no git history' if count is None else f'{count:6,}'}  {name}")
    public = m["backend_public_methods"]
    print(f"Backend's public methods: {len(public)}: {', '.join(public)}")
    print(f"private names imported from another lad module: {len(m['private_imports'])}")
    for where in m["private_imports"]:
        print(f"  {where}")


if __name__ == "__main__":
    main()
