"""The walls between the rooms, read from the source (ast), so a new import that breaks one fails
here with its file and line instead of in a review.

- `workloads/` imports neither ray, mlflow, optuna nor orchestrator (plain PyTorch).
- Only `orchestrator/store/` writes MLflow or Parquet.
- Only `orchestrator/sweep/` imports `ray.tune` / `ray.train`.
- `cluster/` imports nothing of `orchestrator/`.
- `orchestrator/spec/` (the declarative spec language) imports no Ray, MLflow or Optuna and
  nothing of the rooms that use it (sweep, analysis, store, evaluation, cli): they look down at
  it. `orchestrator/analysis/` imports nothing of `orchestrator/sweep/`: it judges what the
  spec says, never reaching up into the room that runs it.
- No two modules import each other, directly or through a cycle. Every import counts, at module
  level or inside a function, because a function-level import is still a dependency: it only
  moves the failure from import time to call time.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("orchestrator", "workloads", "search_spaces", "cluster")


@dataclass(frozen=True)
class Import:
    path: Path  # the importing file
    line: int
    target: str  # the dotted name as written (resolved if relative), e.g. "ray.tune"
    names: tuple[str, ...]  # for `from X import a, b`: ("a", "b"); else ()


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def source_files() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def imports_of(path: Path) -> list[Import]:
    tree = ast.parse(path.read_text(), filename=str(path))
    mod = module_name(path)
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [Import(path, node.lineno, a.name, ()) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            target = node.module or ""
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([target] if target else []))
            out.append(Import(path, node.lineno, target, tuple(a.name for a in node.names)))
    return out


def import_graph() -> dict[str, set[str]]:
    """Project module -> the project modules it imports (`from pkg import mod` counts as mod)."""
    files = source_files()
    modules = {module_name(p) for p in files}
    graph: dict[str, set[str]] = {module_name(p): set() for p in files}
    for p in files:
        src = module_name(p)
        for imp in imports_of(p):
            targets = [f"{imp.target}.{n}" for n in imp.names if f"{imp.target}.{n}" in modules]
            if not targets or len(targets) < len(imp.names):
                targets.append(imp.target)
            for t in targets:
                # `import a.b.c` also runs a/__init__ and a/b/__init__, but those are
                # the package's own business; the edge that matters is to the module named.
                while t and t not in modules:
                    t = t.rpartition(".")[0]
                if t and t != src:
                    graph[src].add(t)
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's SCCs with more than one module: each one is at least one import cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

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
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def count_cycles(graph: dict[str, set[str]], limit: int = 100_000) -> int:
    """Elementary cycles (each counted once, from its smallest module), up to `limit`."""
    order = sorted(graph)
    rank = {v: i for i, v in enumerate(order)}
    n = 0
    for start in order:
        stack = [(start, iter(sorted(graph[start])))]
        on_path = {start}
        while stack:
            v, it = stack[-1]
            w = next(it, None)
            if w is None:
                stack.pop()
                on_path.discard(v)
            elif w == start:
                n += 1
                if n >= limit:
                    return n
            elif rank[w] > rank[start] and w not in on_path:
                on_path.add(w)
                stack.append((w, iter(sorted(graph[w]))))
    return n


def _where(imp: Import) -> str:
    return f"{imp.path.relative_to(ROOT)}:{imp.line}: imports {imp.target}"


def _all_imports() -> list[Import]:
    return [imp for p in source_files() for imp in imports_of(p)]


def _under(imp: Import, folder: str) -> bool:
    return imp.path.relative_to(ROOT).as_posix().startswith(folder + "/")


def _is(target: str, *roots: str) -> bool:
    return any(target == r or target.startswith(r + ".") for r in roots)


def test_workloads_is_plain_pytorch():
    bad = [
        _where(i)
        for i in _all_imports()
        if _under(i, "workloads") and _is(i.target, "ray", "mlflow", "optuna", "orchestrator")
    ]
    assert not bad, "\n".join(bad)


_PARQUET_WRITERS = {"write_table", "write_to_dataset", "write_dataset", "ParquetWriter",
                    "to_parquet"}


def test_only_store_writes_mlflow_and_parquet():
    # MLflow: any import of it (a client can write). Parquet: the calls that write a file.
    # Reading Parquet (pq.read_table, pd.read_parquet) is allowed anywhere: corpora and eval
    # sets read users' .parquet text files, and analysis reads the dataset.
    bad = [_where(i) for i in _all_imports()
           if _is(i.target, "mlflow") and not _under(i, "orchestrator/store")]
    for path in source_files():
        if _under(Import(path, 0, "", ()), "orchestrator/store"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            name = node.attr if isinstance(node, ast.Attribute) else \
                node.id if isinstance(node, ast.Name) else None
            if name in _PARQUET_WRITERS:
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: writes Parquet ({name})")
    assert not bad, "\n".join(bad)


def test_only_sweep_imports_ray_tune_and_train():
    def tune_or_train(i: Import) -> bool:
        if _is(i.target, "ray.tune", "ray.train"):
            return True
        return i.target == "ray" and bool({"tune", "train"} & set(i.names))

    bad = [
        _where(i)
        for i in _all_imports()
        if tune_or_train(i) and not _under(i, "orchestrator/sweep")
    ]
    assert not bad, "\n".join(bad)


def test_cluster_imports_nothing_of_orchestrator():
    bad = [_where(i) for i in _all_imports()
           if _under(i, "cluster") and _is(i.target, "orchestrator")]
    assert not bad, "\n".join(bad)


_ABOVE_SPEC = tuple(f"orchestrator.{room}" for room in
                    ("sweep", "analysis", "store", "evaluation", "cli"))


def test_spec_imports_no_ray_and_nothing_above_it():
    bad = [_where(i) for i in _all_imports()
           if _under(i, "orchestrator/spec")
           and (_is(i.target, "ray", "mlflow", "optuna", *_ABOVE_SPEC)
                or i.target == "orchestrator" and set(i.names) & {"sweep", "analysis", "store",
                                                                  "evaluation", "cli"})]
    assert not bad, "\n".join(bad)


def test_analysis_imports_nothing_of_sweep():
    bad = [_where(i) for i in _all_imports()
           if _under(i, "orchestrator/analysis")
           and (_is(i.target, "orchestrator.sweep")
                or i.target == "orchestrator" and "sweep" in i.names)]
    assert not bad, "\n".join(bad)


def test_no_import_cycles():
    graph = import_graph()
    cycles = strongly_connected(graph)
    lines = []
    for comp in cycles:
        members = set(comp)
        for v in comp:
            path = ROOT / (v.replace(".", "/") + ".py")
            if not path.exists():
                path = ROOT / v.replace(".", "/") / "__init__.py"
            for imp in imports_of(path):
                hits = {t for t in graph[v] & members if _is(imp.target, t) or any(
                    f"{imp.target}.{n}" == t for n in imp.names)}
                lines += [f"{_where(imp)} (cycle: {' <-> '.join(comp)})" for _ in hits]
    assert not cycles, f"{len(cycles)} import cycle(s):\n" + "\n".join(sorted(set(lines)))


def test_graph_sees_function_level_and_relative_imports(tmp_path, monkeypatch):
    # The detector itself: a cycle made only of a function-level import is still a cycle, and
    # `from . import a` is an edge to the module a, not to its package.
    pkg = tmp_path / "orchestrator"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from orchestrator import b\n")
    (pkg / "b.py").write_text("def f():\n    from . import a\n    return a\n")
    (pkg / "c.py").write_text("import orchestrator.a\n")
    here = sys.modules[__name__]
    monkeypatch.setattr(here, "ROOT", tmp_path)
    monkeypatch.setattr(here, "PACKAGES", ("orchestrator",))
    graph = import_graph()
    assert graph["orchestrator.a"] == {"orchestrator.b"}
    assert graph["orchestrator.b"] == {"orchestrator.a"}
    assert graph["orchestrator.c"] == {"orchestrator.a"}
    assert strongly_connected(graph) == [["orchestrator.a", "orchestrator.b"]]
    assert count_cycles(graph) == 1
