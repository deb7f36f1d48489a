"""The import graph of ``auturi/`` and ``bench/`` has no circle and no import that runs from a
lower layer up.

Every ``import`` statement counts, module-level or inside a function (a lazy import still
ties the two modules together: each must be read to follow the other), those under ``if
TYPE_CHECKING:`` too (they never run, but a reader must follow them all the same: a module
typed by another's class knows that class), and so does ``importlib.import_module("name")``
with a literal name. A package's ``__init__`` is its own node; the implicit import of a
parent package by its submodules is not an edge (else every package that re-exports its
submodules would be a circle).

Also here: the tuner reaches the executor only through its contract
(:class:`auturi.executor.contract.ExecutorLike`): no module of it imports a backend.

Run as a script for the report: ``python -m tests.test_imports``.
"""
from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("auturi", "bench")

# Layers, lowest first: a module may import its own layer and those below, never above.
# The first matching prefix names a module's layer.
LAYERS: list[tuple[str, ...]] = [
    ("auturi._version", "auturi.errors", "auturi._forkserver_signals"),
    ("auturi.config", "auturi.envs", "auturi.rollout", "auturi.policy", "auturi.nets", "auturi.resources",
     "auturi.sampling", "auturi.device_wait"),
    ("auturi.executor",),
    ("auturi.tuner",),
    ("auturi.server",),  # the status server: the tuner's events out, no training framework
    ("auturi.adapters",),
    ("auturi.cli", "auturi"),  # the faces: the command line and the package root
    ("bench",),
]


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _import_module_call(node: ast.AST) -> str | None:
    """The literal name of an ``importlib.import_module("name")`` (or ``import_module("name")``) call."""
    if not isinstance(node, ast.Call) or not node.args:
        return None
    f = node.func
    named = (isinstance(f, ast.Attribute) and f.attr == "import_module") or (
        isinstance(f, ast.Name) and f.id == "import_module")
    arg = node.args[0]
    return arg.value if named and isinstance(arg, ast.Constant) and isinstance(arg.value, str) else None


def imported_names(tree: ast.AST, name: str, is_pkg: bool, modules: set[str] = frozenset()) -> set[str]:
    """Every module name this module's imports name, internal or not (see the module
    docstring): ``from a import b`` names ``a.b`` when that is one of ``modules``, else ``a``."""
    out: set[str] = set()
    stack = [tree]
    while stack:
        node = stack.pop()
        dynamic = _import_module_call(node)
        if dynamic is not None:
            out.add(dynamic)
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = name.split(".") if is_pkg else name.split(".")[:-1]
                pkg = pkg[:len(pkg) - node.level + 1]
                base = ".".join(pkg + ([base] if base else []))
            out.update(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names)
        stack.extend(ast.iter_child_nodes(node))
    return out


def _imported(tree: ast.AST, name: str, is_pkg: bool, modules: set[str]) -> set[str]:
    """The modules of ``modules`` that this module imports (:func:`imported_names`)."""
    return imported_names(tree, name, is_pkg, modules) & modules


def _source_root(root: Path, pkg: str) -> Path:
    """Where ``pkg`` lives under ``root``: the package under src/ (src layout), else at the top."""
    return root / "src" if (root / "src" / pkg).is_dir() else root


def import_graph(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    """module -> the internal modules it imports."""
    files = {module_name(p, _source_root(root, pkg)): p for pkg in packages
             for p in sorted((_source_root(root, pkg) / pkg).rglob("*.py"))}
    return {name: _imported(ast.parse(path.read_text(), str(path)), name, path.name == "__init__.py",
                            set(files)) - {name}
            for name, path in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
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
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def layer(module: str) -> int:
    for i, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return i
    raise KeyError(f"{module} is in no layer of tests/test_imports.py's LAYERS: add it")


def upward(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(importer, imported) pairs where the imported module sits in a higher layer."""
    return sorted((a, b) for a, bs in graph.items() for b in bs if layer(b) > layer(a))


def report() -> str:
    g = import_graph()
    lines = [f"{len(g)} modules, {sum(map(len, g.values()))} internal imports"]
    lines += [f"circle: {' <-> '.join(c)}" for c in cycles(g)]
    lines += [f"upward: {a} -> {b}" for a, b in upward(g)]
    return "\n".join(lines)


# ------------------------------------------------------------------------------ tests
def test_the_checker_sees_a_circle_and_an_upward_import(tmp_path):
    """The checker itself, on a made-up package: a lazy import closing a circle, a relative
    import, an import from the executor up to the tuner, one under ``TYPE_CHECKING`` and one
    through ``importlib``."""
    pkg = tmp_path / "auturi"
    (pkg / "executor").mkdir(parents=True)
    (pkg / "tuner").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "executor" / "__init__.py").write_text("from .base import X\n")
    (pkg / "executor" / "base.py").write_text("def f():\n    from auturi.tuner.model import Y\n")
    (pkg / "executor" / "ray.py").write_text("from typing import TYPE_CHECKING\n"
                                             "if TYPE_CHECKING:\n    from auturi.executor.watch import W\n")
    (pkg / "executor" / "watch.py").write_text("import importlib\n"
                                               "def g():\n    importlib.import_module('auturi.executor.ray')\n")
    (pkg / "tuner" / "__init__.py").write_text("")
    (pkg / "tuner" / "model.py").write_text("from auturi.executor import base\n")
    g = import_graph(tmp_path, ("auturi",))
    assert g["auturi.executor"] == {"auturi.executor.base"}
    assert g["auturi.tuner.model"] == {"auturi.executor.base"}
    assert g["auturi.executor.ray"] == {"auturi.executor.watch"}  # under TYPE_CHECKING: an edge
    assert g["auturi.executor.watch"] == {"auturi.executor.ray"}  # through importlib: an edge
    assert cycles(g) == [["auturi.executor.base", "auturi.tuner.model"],
                         ["auturi.executor.ray", "auturi.executor.watch"]]
    assert upward(g) == [("auturi.executor.base", "auturi.tuner.model")]


def test_the_version_is_declared_once():
    """pyproject.toml takes the distribution's version from auturi/_version.py, which the
    package root re-exports."""
    from setuptools.config.pyprojecttoml import read_configuration

    import auturi
    from auturi._version import __version__

    assert read_configuration(ROOT / "pyproject.toml", expand=True)["project"]["version"] == __version__
    assert auturi.__version__ is __version__


def test_no_import_circle():
    g = import_graph()
    assert sum(m.startswith("auturi.") for m in g) > 50 and any(m.startswith("bench.") for m in g)  # not vacuous
    assert cycles(g) == []


def test_no_upward_import():
    assert set(upward(import_graph())) == set()


if __name__ == "__main__":
    print(report())
    sys.exit(0)


def test_a_script_next_to_a_clone_imports_the_installed_package(tmp_path):
    """A clone named like the package, with a script saved beside it: with the flat layout,
    `import auturi` picked the clone's directory (a namespace package without TorchPolicy);
    under src/ the installed package wins."""
    import shutil
    import subprocess
    import sys

    clone = tmp_path / "auturi"  # what `git clone .../auturi` makes
    shutil.copytree(ROOT / "src", clone / "src", ignore=shutil.ignore_patterns("__pycache__"))
    (clone / "tests").mkdir()
    script = tmp_path / "train.py"
    script.write_text("import auturi\nprint(auturi.__file__, hasattr(auturi, 'TorchPolicy'))\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert out.returncode == 0, out.stderr
    path, has = out.stdout.split()
    assert has == "True" and not path.startswith(str(clone))


# ------------------------------------------------------------------------------ the tuner's side
TUNER_REACHES_IN = re.compile(r"getattr\(self\.executor|executor\.shm|ray_backend|_ctrl\b")
"""What ``grep -rn "getattr(self.executor\\|executor\\.shm\\|ray_backend\\|_ctrl\\b" src/auturi/tuner``
looks for: probes of an executor's members, a backend's modules, a backend's private state."""


def test_the_tuner_asks_the_executor_only_through_its_contract():
    """Issue 31's check: nothing in ``auturi.tuner`` probes an executor by ``getattr`` or names a
    backend's insides, and no tuner module imports a backend (``executor.shm``, the ``ray``
    backend, or Ray itself): what the tuner may use is :class:`~auturi.executor.contract.ExecutorLike`."""
    tuner = ROOT / "src" / "auturi" / "tuner"
    files = sorted(tuner.rglob("*.py"))
    assert len(files) > 10  # not vacuous
    hits = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}" for p in files
            for i, line in enumerate(p.read_text().splitlines(), 1) if TUNER_REACHES_IN.search(line)]
    assert hits == []
    backends = ("auturi.executor.shm", "auturi.executor.ray", "ray")
    imports = {module_name(p, ROOT / "src"): imported_names(ast.parse(p.read_text()), module_name(p, ROOT / "src"),
                                                              p.name == "__init__.py")
               for p in files}
    assert any("auturi.executor.contract" in names for names in imports.values())  # it does see the contract
    bad = sorted((m, n) for m, names in imports.items() for n in names
                 if any(n == b or n.startswith(b + ".") or n.startswith(b + "_") for b in backends))
    assert bad == []


def test_the_reach_in_pattern_finds_what_it_must():
    """The pattern above, on the lines it was written against (so that an empty result means
    something)."""
    found = [bool(TUNER_REACHES_IN.search(line)) for line in (
        'warm = getattr(self.executor, "warm_start", None)', "from auturi.executor.shm.forkservers import x",
        "from auturi.executor.ray_backend import ClusterResources", "ctrl = ex._ctrl", "self._ctrl_block = 1",
        "from auturi.executor.contract import as_executor_like")]
    assert found == [True, True, True, True, False, False]
