"""The import rule (docs/DESIGN.md, "Layers"): a module imports only from its own layer or the layers below
it, at module level and inside functions alike. Imports are read with `ast`, never executed."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "tgc"

# bottom to top; a module belongs to the longest prefix listed
LAYERS: list[tuple[str, ...]] = [
    ("tgc.errors", "tgc.dtype", "tgc.env", "tgc.cache", "tgc.version", "tgc.capabilities", "tgc.sizeexpr",
     "tgc.timings", "tgc.profile", "tgc.interfaces", "tgc.files"),  # 0
    ("tgc.ir",),  # 1 UOps, the pattern matcher, symbolic folding, kernel ASTs
    ("tgc.dsl", "tgc.onnx"),  # 2 front ends: .tg source -> tensor graph; ONNX models -> .tg source + weights
    ("tgc.engine", "tgc.baselines"),  # 3 scheduler, realizer (on a lowered program), bench timing, references;
    # numpy baselines of a parsed program (bench and `tgc bench --vs numpy` only, never the core)
    ("tgc.codegen",),  # 4 optimizer, lowering, linear UOps, BEAM (on device objects it is given)
    ("tgc.backends",),  # 5 renderers, compilers, runtimes, the device registry, REMOTE
    ("tgc.api", "tgc.package", "tgc.progcache", "tgc.viz", "tgc.staged"),  # 6 Program: binds the layers together
    # for one program; ONNX models run in stages (tgc.staged); compiled packages; the program cache (packages in
    # the disk cache); the `tgc viz` page of a loaded program
    ("tgc.cli",),  # 7 the command line
    ("tgc",),  # 8 the package facade (`tgc.load` etc. import tgc.api on first use)
]

# (importer, imported) pairs allowed to point upward until their reason is gone; each must still exist
EXCEPTIONS: dict[tuple[str, str], str] = {}


def layer_of(module: str) -> int:
    best, level = -1, None
    for i, names in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and len(name) > best:
                best, level = len(name), i
    if level is None:
        raise KeyError(module)
    return level


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(source: str, module: str, is_package: bool = False) -> list[tuple[str, int]]:
    """Every tgc module `source` imports (anywhere in it), with its line."""
    package = module if is_package else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # `from tgc.backends import python` names a module: count the deepest one
            found += [(f"{target}.{a.name}" if (ROOT.parent / f"{target}.{a.name}".replace(".", "/")).with_suffix(
                ".py").exists() else target, node.lineno) for a in node.names]
    return [(m, line) for m, line in found if m == "tgc" or m.startswith("tgc.")]


def violations(source: str, module: str, is_package: bool = False) -> list[str]:
    out = []
    for target, line in imports_of(source, module, is_package):
        if layer_of(target) > layer_of(module) and (module, target) not in EXCEPTIONS:
            out.append(f"{module}:{line} imports {target} (layer {layer_of(target)} above {layer_of(module)})")
    return out


def sources() -> list[tuple[str, str, bool]]:
    return [(module_name(p), p.read_text(encoding="utf-8"), p.name == "__init__.py")
            for p in sorted(ROOT.rglob("*.py"))]


def test_every_module_has_a_layer():
    for module, _, _ in sources():
        layer_of(module)  # KeyError names a package that is not placed in LAYERS


def test_no_module_imports_a_higher_layer():
    bad = [v for module, src, pkg in sources() for v in violations(src, module, pkg)]
    assert not bad, "\n".join(bad)


def test_exceptions_are_still_needed():
    used = {(module, target) for module, src, pkg in sources() for target, _ in imports_of(src, module, pkg)}
    assert set(EXCEPTIONS) <= used, f"stale entries: {set(EXCEPTIONS) - used}"


@pytest.mark.parametrize("src", [
    "from tgc.api import Program\n",  # module level
    "def f():\n    from tgc.backends import get_device\n",  # inside a function
    "def f():\n    import tgc.codegen.kernel\n",
    "from ..backends import cpu\n",  # relative
])
def test_the_checker_sees_upward_imports(src):
    assert violations(src, "tgc.engine.realize")


def test_the_checker_allows_downward_imports():
    src = "from tgc.ir.uop import UOp\nfrom ..dsl import frontend\ndef f():\n    from tgc.engine.schedule import x\n"
    assert violations(src, "tgc.engine.bench") == []
    assert imports_of("from . import schedule\n", "tgc.engine.bench") == [("tgc.engine.schedule", 1)]


# module import cycles (any import, inside functions too) still to be untied, each with its reason
KNOWN_CYCLES: dict[frozenset[str], str] = {}


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(frozenset(comp))

    for v in list(graph):
        if v not in index:
            visit(v)
    return out


def import_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for module, src, pkg in sources():
        graph.setdefault(module, set()).update(t for t, _ in imports_of(src, module, pkg) if t != module)
    return graph


def test_no_import_cycles():
    found = cycles(import_graph())
    assert set(found) <= set(KNOWN_CYCLES), [sorted(c) for c in found if c not in KNOWN_CYCLES]


def test_the_cycle_finder_sees_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [frozenset("abc")]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_realizer_runs_a_lowered_program_without_the_api():
    """`Program.lower` hands the realizer an Executable: the device, the launch steps and the input/output nodes;
    nothing else."""
    import numpy as np

    import tgc
    from tgc.engine.executable import Executable, run
    prog = tgc.loads("x: f32[N]\ny: f32[N]\nreturn (x * y).sum(), x + 1.0")
    low = prog.lower("CPU", {"N": 1000})
    assert isinstance(low, Executable) and [name for _, name in low.inputs] == ["x", "y"]
    x, y = np.arange(1000, dtype=np.float32), np.ones(1000, np.float32)
    got = run(low, {"x": x, "y": y})
    np.testing.assert_allclose(got["out0"], (x * y).sum(), rtol=1e-6)
    np.testing.assert_array_equal(got["out1"], x + 1)


def function_level_imports(source: str) -> list[tuple[str, int]]:
    """tgc modules imported inside a function (module-level imports excluded), with their line."""
    out = []
    for fn in ast.walk(ast.parse(source)):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("tgc")):
                    out.append((node.module or ".", node.lineno))
                elif isinstance(node, ast.Import):
                    out += [(a.name, node.lineno) for a in node.names if a.name.startswith("tgc")]
    return out


def test_codegen_and_the_api_import_tgc_modules_at_module_level():
    """No import inside a function to dodge a cycle: codegen, the engine and the API import the tgc modules they
    use at the top (the CLI and the `tgc` facade import lazily on purpose, for start-up time)."""
    found = [f"{module}:{line} imports {target}" for module, src, _ in sources()
             if module.startswith(("tgc.codegen", "tgc.engine", "tgc.api", "tgc.ir", "tgc.dsl"))
             for target, line in function_level_imports(src) if (module, target) not in LAZY]
    assert found == []


# deliberate lazy imports in those layers, each with its reason
LAZY: dict[tuple[str, str], str] = {
    ("tgc.engine.inputs", "tgc.dsl.frontend"): "running a package draws random inputs without loading the parser",
    ("tgc.engine.executable", "tgc.engine"): "a warm run does not import the bench module (nor statistics) it "
                                             "needs only to bench",
    ("tgc.engine.executable", "tgc.engine.multi"): "a warm run on one device does not import the collectives and "
                                                   "device-to-device copies (~4 ms) only a device list's walk uses",
}


def test_the_function_level_import_finder_sees_one():
    assert function_level_imports("import tgc.ir\ndef f():\n    from tgc.ir import uop\n") == [("tgc.ir", 3)]
