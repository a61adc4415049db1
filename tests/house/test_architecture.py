"""The harness reaches implementations only through the plug-in contract.

No module of diffmoe/ imports an implementation package (`optimized`, `peers`, or a submodule
of either), neither by an import statement nor by `importlib.import_module` / `__import__` of
a literal name: the default implementation is named once, as a string
(diffmoe.contract.DEFAULT_IMPLEMENTATION), and loaded as any `--impl` is. What the harness
needs from an implementation beyond running it (its plan, its doctor hooks) comes through the
factory (contract.factory_plan, contract.factory_attribute).
"""

from __future__ import annotations

import ast
import importlib
import warnings
from pathlib import Path

import pytest

from diffmoe import contract
from diffmoe.problem.config import MoEConfig

HARNESS = Path(__file__).resolve().parents[2] / "diffmoe"
# Top-level packages the harness must not import (add "reference" here once the runner takes the
# reference through the contract too).
FORBIDDEN_IMPORTS = frozenset({"optimized", "peers"})
_DYNAMIC_IMPORTS = {"import_module", "__import__"}


def _forbidden(name: str | None) -> bool:
    return name is not None and name.split(".")[0] in FORBIDDEN_IMPORTS


def forbidden_imports(root: Path) -> list[str]:
    """'path:line: what' for every import of a FORBIDDEN_IMPORTS package in the .py files under root."""
    hits = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in sorted(ast.walk(tree), key=lambda n: getattr(n, "lineno", 0)):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:  # relative imports stay inside diffmoe
                names = [node.module or ""]
            elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
                func = node.func
                called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
                if called in _DYNAMIC_IMPORTS and isinstance(node.args[0].value, str):
                    names = [node.args[0].value]
            for name in names:
                if _forbidden(name):
                    hits.append(f"{path.relative_to(root.parent)}:{node.lineno}: imports {name}")
    return hits


def test_no_harness_module_imports_an_implementation():
    hits = forbidden_imports(HARNESS)
    assert not hits, "the harness must reach implementations only through diffmoe.contract:\n" + "\n".join(hits)


def test_the_checker_sees_every_form_of_import(tmp_path):
    """The test above can fail: each way of importing an implementation is caught, with file and line."""
    pkg = tmp_path / "diffmoe"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "sub" / "bad.py").write_text(
        "import os\n"
        "import optimized\n"
        "import peers.thing as t\n"
        "from optimized.conformance import doctor_main\n"
        "def f():\n"
        "    from peers import x\n"
        "    importlib.import_module('optimized.workspace_planner')\n"
        "    __import__('peers')\n"
        "from . import optimized_helpers\n"  # relative: a diffmoe module, allowed
        "import optimizedish\n"  # another package that only starts alike
        "importlib.import_module(name)\n",  # not a literal: what load_factory does with --impl
        encoding="utf-8",
    )
    assert forbidden_imports(pkg) == [
        "diffmoe/sub/bad.py:2: imports optimized",
        "diffmoe/sub/bad.py:3: imports peers.thing",
        "diffmoe/sub/bad.py:4: imports optimized.conformance",
        "diffmoe/sub/bad.py:6: imports peers",
        "diffmoe/sub/bad.py:7: imports optimized.workspace_planner",
        "diffmoe/sub/bad.py:8: imports peers",
    ]


# ---- no import circles -------------------------------------------------------------------

REPO = HARNESS.parent
PACKAGES = ("diffmoe", "optimized", "reference", "peers")


def _modules(root: Path, packages) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of `packages` under root."""
    found = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _imports_run_at_import(tree: ast.Module):
    """The import statements that run when the module is imported: outside function bodies, not
    under `if TYPE_CHECKING`."""
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            todo.extend(node.orelse)
            continue
        yield node
        todo.extend(ast.iter_child_nodes(node))


def import_graph(root: Path, packages=PACKAGES, lazy: bool = True) -> dict[str, set[str]]:
    """Module -> the modules of `packages` it imports anywhere in its text: at the top, inside
    a function (a lazy import is still an arrow) or under TYPE_CHECKING; relative imports
    resolved, `from package import module` counted as an import of the module. A module's
    own parent packages are left out (importing a submodule runs them anyway). lazy=False:
    only the imports that run when the module is imported (_imports_run_at_import)."""
    modules = _modules(root, packages)

    def known(name: str) -> str | None:
        parts = name.split(".")
        while parts and ".".join(parts) not in modules:
            parts.pop()
        return ".".join(parts) or None

    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree) if lazy else _imports_run_at_import(tree):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(parts + ([node.module] if node.module else []))
                targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
            else:
                continue
            for target in filter(None, map(known, targets)):
                if target != name and not name.startswith(target + "."):
                    graph[name].add(target)
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

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
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(circles)


def test_no_import_circles():
    """diffmoe/, optimized/, reference/ and peers/ import one another in one direction only:
    every module can be read after the ones it imports (lazy and TYPE_CHECKING imports count)."""
    circles = import_circles(import_graph(REPO))
    assert not circles, "import circles:\n" + "\n".join(" <-> ".join(c) for c in circles)


def test_the_circle_checker_sees_lazy_relative_and_type_checking_imports(tmp_path):
    """The test above can fail: a circle closed by a function-level import, one by a
    TYPE_CHECKING import through a subpackage, and none for a parent package or a lookalike."""
    pkg = tmp_path / "diffmoe"
    (pkg / "sub").mkdir(parents=True)
    for path, text in {
        "__init__.py": "",
        "a.py": "from .b import thing\n",
        "b.py": "def f():\n    from . import a\n",
        "c.py": "from .sub.d import D\n",
        "sub/__init__.py": "",
        "sub/d.py": "from typing import TYPE_CHECKING\nfrom .. import sub\nif TYPE_CHECKING:\n    from ..c import C\n",
        "e.py": "import diffmoe.sub\nimport diffmoeish\n",
    }.items():
        (pkg / path).write_text(text, encoding="utf-8")
    graph = import_graph(tmp_path, packages=("diffmoe",))
    assert graph["diffmoe.e"] == {"diffmoe.sub"}
    assert import_circles(graph) == [["diffmoe.a", "diffmoe.b"], ["diffmoe.c", "diffmoe.sub.d"]]


# ---- the layers: a declared folder order no import runs up (issue 44) -----------------------

# diffmoe's folders and top-level modules, lowest first (docs/flow.md draws it). A module may import
# one of its own folder or of a lower layer, never of a higher one nor a sibling folder of its
# own layer; the package's __init__ (the verbs, read lazily) sits above them all.
LAYERS = (
    ("moved",),  # the table of moved paths: imports nothing of diffmoe
    ("problem",),  # the problem's language: config, vocabulary, inputs, models
    ("contract", "findings"),  # what an implementation provides; what anything that judges reports
    ("tolerance",),  # how close is close enough
    ("interpreter",),  # Triton interpreter hooks and the address record
    ("backend",),  # the backend's probes, the doctor, the compile gate
    ("adapters",),  # loading a factory, the kit, families, peer wheels
    ("check",),  # one check's machinery: the candidate's runs, recording, guards, workers, report
    ("isolation",),  # the candidate's process and its boundary
    ("oracles",),  # one module per oracle
    ("judge",),  # run_differential: one check orchestrated
    ("cluster",),  # long runs' tasks, runtime and progress
    ("fuzz", "numerics_fit"),  # searches over checks
    ("museum", "tuned_configs"),  # feature folders: each a command over checks
    ("frontends",),  # the command line and the pytest plugin
    ("config", "runner", "strategies", "pytest_plugin", "__main__"),  # the public modules
)


def layer_of(module: str) -> tuple[int, str] | None:
    """(layer, folder) of a diffmoe module; None for the package itself and for other packages."""
    parts = module.split(".")
    if parts[0] != "diffmoe" or len(parts) == 1:
        return None
    for index, names in enumerate(LAYERS):
        if parts[1] in names:
            return index, parts[1]
    raise AssertionError(f"{module}: its folder {parts[1]!r} has no place in LAYERS (tests/house/test_architecture.py)")


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """'a -> b (why)' for each import that runs up LAYERS or across to a sibling folder."""
    bad = []
    for module, targets in sorted(graph.items()):
        here = layer_of(module)
        for target in sorted(targets):
            there = layer_of(target)
            if here is None or there is None or here[1] == there[1]:
                continue
            if there[0] > here[0]:
                bad.append(f"{module} -> {target} ({here[1]} is below {there[1]})")
            elif there[0] == here[0]:
                bad.append(f"{module} -> {target} ({here[1]} and {there[1]} are siblings)")
    return bad


def test_every_folder_has_its_place_in_the_layers():
    placed = [name for names in LAYERS for name in names]
    assert len(placed) == len(set(placed))
    present = {p.stem for p in HARNESS.glob("*.py")} - {"__init__"}
    present |= {p.name for p in HARNESS.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    assert present == set(placed), f"not placed: {sorted(present - set(placed))}; gone: {sorted(set(placed) - present)}"


def test_no_import_runs_up_the_layers():
    """Lazy and TYPE_CHECKING imports count: a reader follows the layers down from any module."""
    bad = upward_imports(import_graph(REPO))
    assert not bad, "imports that run up the declared layers:\n" + "\n".join(bad)


@pytest.mark.parametrize("planted, found", [
    ("interpreter/fixes.py", "diffmoe.interpreter.fixes -> diffmoe.backend.conformance (interpreter is below backend)"),
    ("fuzz/driver.py", "diffmoe.fuzz.driver -> diffmoe.numerics_fit.fit (fuzz and numerics_fit are siblings)"),
    (None, None),
])
def test_the_layer_checker_sees_a_planted_import(tmp_path, planted, found):
    """The rule above can fail: a function-level import of a higher layer, an import of a sibling
    folder; imports down the layers and within a folder pass."""
    pkg = tmp_path / "diffmoe"
    files = {"__init__.py": "from diffmoe.judge.runner import run\n", "contract.py": "from diffmoe.problem import config\n",
             "problem/__init__.py": "", "problem/config.py": "", "backend/__init__.py": "",
             "backend/conformance.py": "from diffmoe.interpreter import fixes\n", "interpreter/__init__.py": "",
             "interpreter/fixes.py": "from . import dot_rows\n", "interpreter/dot_rows.py": "", "judge/__init__.py": "",
             "judge/runner.py": "def run():\n    from diffmoe.backend import conformance\n", "fuzz/__init__.py": "",
             "fuzz/driver.py": "from diffmoe.judge.runner import run\n", "numerics_fit/__init__.py": "",
             "numerics_fit/fit.py": "import diffmoe.contract\n"}
    for path, text in files.items():
        (pkg / path).parent.mkdir(parents=True, exist_ok=True)
        (pkg / path).write_text(text, encoding="utf-8")
    if planted == "interpreter/fixes.py":
        (pkg / planted).write_text("def probe():\n    from diffmoe.backend import conformance\n", encoding="utf-8")
    elif planted == "fuzz/driver.py":
        (pkg / planted).write_text("from diffmoe.numerics_fit.fit import fit\n", encoding="utf-8")
    bad = upward_imports(import_graph(tmp_path, packages=("diffmoe",)))
    assert (found in bad) if found else not bad, bad


# ---- the house: concept folders and the package's face ------------------------------------

# The public modules users import (README, docs, examples; docs/api.md), besides `diffmoe` itself
# and `diffmoe.contract` (the real contract, at the ground): each exports a declared `__all__` of
# objects that live in the module it names, and is not that module (no `sys.modules` swap: a
# reader and a static tool follow one import, issue 44).
FACES = {
    "diffmoe.config": "diffmoe.problem.config",
    "diffmoe.runner": "diffmoe.judge.runner",
    "diffmoe.strategies": "diffmoe.fuzz.strategies",
    "diffmoe.pytest_plugin": "diffmoe.frontends.pytest_plugin",
}
# Modules at diffmoe/'s top besides the faces: the contract and the findings (the ground every layer
# speaks), and the table of moved paths
TOP_MODULES = {"contract", "findings", "moved"}


def test_every_module_lives_in_a_concept_folder_but_the_face():
    """diffmoe/ holds folders; the only modules at its top are __init__, __main__, the faces, the
    contract, the findings and the moved paths' table."""
    top = {p.stem for p in HARNESS.glob("*.py")} - {"__init__", "__main__"}
    assert top == {face.split(".")[1] for face in FACES} | TOP_MODULES, f"modules outside a concept folder: {sorted(top)}"
    for folder in (p for p in HARNESS.iterdir() if p.is_dir() and p.name != "__pycache__"):
        assert (folder / "__init__.py").is_file(), f"{folder.name}/ is not a package"


@pytest.mark.parametrize("face", sorted(FACES))
def test_a_public_module_exports_its_names_from_the_module_it_names(face):
    """Each name of a face's `__all__` is importable from it without a warning; the face is its
    own module (monkeypatching it does not reach the home: users patch the home, as the project does)."""
    home = importlib.import_module(FACES[face])
    module = importlib.import_module(face)
    assert module is not home and "sys.modules" not in Path(module.__file__).read_text(encoding="utf-8")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in module.__all__:
            value = getattr(module, name)
            assert getattr(home, name, value) is value, f"{face}.{name} is not {FACES[face]}.{name}"


def test_the_public_names_of_the_readme_import():
    from diffmoe import MoEConfig as top_config, make_problem as top_make_problem
    from diffmoe.config import MoEConfig
    from diffmoe.contract import MoEImplementation
    from diffmoe.problem import make_problem
    from diffmoe.runner import run_differential
    from diffmoe.strategies import moe_configs

    assert MoEConfig is top_config and make_problem is top_make_problem
    assert callable(run_differential) and callable(moe_configs) and MoEImplementation
    with pytest.raises(AttributeError):
        importlib.import_module("diffmoe.problem").no_such_name


def face_imports(graph: dict[str, set[str]]) -> list[str]:
    """Arrows into a face from a module other than the package's own __init__: code of the
    project imports the real module, so a reader follows one path (the faces are for users)."""
    return sorted(f"{m} -> {t}" for m, targets in graph.items() for t in targets
                  if t in FACES and m != "diffmoe" and m not in FACES)


def test_the_project_imports_real_modules_not_faces():
    assert not face_imports(import_graph(REPO))


def test_the_face_checker_sees_an_import_of_a_face():
    assert face_imports({"optimized.moe": {"diffmoe.runner", "diffmoe.contract"}, "diffmoe": {"diffmoe.config"}}) == [
        "optimized.moe -> diffmoe.runner"]


# ---- the contract's default and its optional factory attributes ---------------------------


def test_the_default_implementation_is_named_once():
    assert contract.DEFAULT_IMPLEMENTATION == "optimized:make_implementation"
    assert contract.DEFAULT_IMPLEMENTATION_NAME == "optimized"
    from diffmoe.check import report

    assert not hasattr(report, "DEFAULT_IMPLEMENTATION"), "the default is named in diffmoe.contract only"
    assert report.check_command(MoEConfig()) == report.check_command(MoEConfig(), contract.DEFAULT_IMPLEMENTATION_NAME)
    assert "--impl" not in report.check_command(MoEConfig())


@pytest.mark.parametrize("alias", sorted(contract.IMPLEMENTATION_ALIASES))
def test_a_replay_line_keeps_an_implementation_alias(alias):
    """`diffmoe check --impl vllm` names its implementation by the alias: the replay line must
    pass it back (it once ended in an unloadable `--impl MODULE:FACTORY`)."""
    from diffmoe.check import report

    line = report.check_command(MoEConfig(), alias)
    assert line.endswith(f"--impl {alias}") and report.UNREPLAYABLE_IMPL not in line


CONFIGS = [
    MoEConfig(num_tokens=8, num_experts=4, topk=2, hidden=256, inter=256, quant="fp8-token", fused=True, planner="legacy"),
    MoEConfig(num_tokens=5, num_experts=2, topk=1, hidden=128, inter=128, quant="bf16", fused=False, output="workspace"),
]


@pytest.mark.parametrize("config", CONFIGS, ids=["fp8-fused-legacy", "bf16-output-in-ws1"])
def test_the_cheap_plan_is_the_built_implementations_plan(config):
    module, _, name = contract.DEFAULT_IMPLEMENTATION.partition(":")
    factory = getattr(importlib.import_module(module), name)
    assert contract.factory_attribute(factory, contract.PLAN_WORKSPACES) is not None
    built = factory(config)
    for t in (config.num_tokens, 1):
        assert contract.factory_plan(factory, config, t) == built.workspace_plan(t)


def test_a_factory_without_the_attribute_is_built_and_asked():
    asked = []

    class Impl:
        def __init__(self, config):
            self.config = config

        def workspace_plan(self, num_tokens):
            asked.append(num_tokens)
            return "the plan"

    assert contract.factory_attribute(Impl, contract.PLAN_WORKSPACES) is None
    assert contract.factory_plan(Impl, MoEConfig()) == "the plan" and asked == [MoEConfig().num_tokens]
    with pytest.raises(ValueError, match="no optional factory attribute"):
        contract.factory_attribute(Impl, "workspace_plan")


# ---- the factory resolved once (issue 44): a typed handle, no string getattr outside it ---------

# Every attribute of a factory or a built implementation the contract names (diffmoe.contract.FactoryHandle
# reads the factory's; compile_variants and applies_own_order the implementation's), and the factory's own names
HANDLED = frozenset({*contract.FACTORY_ATTRIBUTES, contract.BATCH_INVARIANT, contract.PEER_WHEEL, contract.TUNED_CONFIG_DIR,
                     contract.WITH_TILE_CONFIG, contract.COMPILE_VARIANTS, contract.ORDERS_PROGRAMS,
                     "__module__", "__qualname__"})
_HANDLED_CONSTANTS = frozenset({"PLAN_WORKSPACES", "CONFORMANCE_HOOKS", "SUPPORTS", "NUMERICS", "BATCH_INVARIANT",
                                "PEER_WHEEL", "TUNED_CONFIG_DIR", "WITH_TILE_CONFIG", "COMPILE_VARIANTS", "ORDERS_PROGRAMS"})


def string_getattrs(root: Path, exempt: tuple[str, ...] = ("contract.py",)) -> list[str]:
    """'path:line: getattr(..., name)' for each getattr/hasattr of a HANDLED name (a literal, or the
    contract's constant) in the .py files under root, but the exempt ones (the handle's home)."""
    hits = []
    for path in sorted(root.rglob("*.py")):
        if path.name in exempt and path.parent == root:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in ("getattr", "hasattr") and len(node.args) >= 2):
                continue
            name = node.args[1]
            literal = isinstance(name, ast.Constant) and name.value in HANDLED
            constant = isinstance(name, (ast.Name, ast.Attribute)) and \
                (name.id if isinstance(name, ast.Name) else name.attr) in _HANDLED_CONSTANTS
            if literal or constant:
                hits.append(f"{path.relative_to(root.parent)}:{node.lineno}: {ast.unparse(node)}")
    return hits


def test_no_module_reads_a_factory_attribute_by_name_but_the_contract():
    assert string_getattrs(HARNESS) == []


@pytest.mark.parametrize("planted", [
    'x = getattr(factory, "supports", None)',
    "from diffmoe.contract import NUMERICS\nx = getattr(make, NUMERICS, None)",
    'x = hasattr(f, "compile_variants")',
    'x = getattr(f, contract.PEER_WHEEL)',
])
def test_the_getattr_checker_sees_a_planted_read(tmp_path, planted):
    pkg = tmp_path / "diffmoe"
    pkg.mkdir()
    (pkg / "contract.py").write_text('x = getattr(f, "supports", None)\n')  # the handle's home: exempt
    (pkg / "elsewhere.py").write_text(planted + "\n")
    hits = string_getattrs(pkg)
    assert len(hits) == 1 and hits[0].startswith("diffmoe/elsewhere.py:")


def test_a_factory_is_resolved_once_into_a_typed_handle():
    def make(config):
        return ("built", config)

    make.numerics = "vllm"
    make.batch_invariant = False
    make.supports = lambda config: None
    make.name = "my kernel"
    handle = contract.resolve_factory(make)
    assert contract.resolve_factory(handle) is handle
    assert handle.numerics == "vllm" and handle.batch_invariant is False and handle.peer_wheel is None
    assert handle.supports is make.supports and handle.plan_workspaces is None and handle.tuned_configs is None
    assert handle.label == "my kernel" and handle.qualname.endswith("make") and handle.module == __name__
    assert handle(MoEConfig()) == ("built", MoEConfig())
    make.numerics = "diffmoe"  # read once: the handle keeps what it read
    assert handle.numerics == "vllm" and contract.factory_numerics(make) == "diffmoe"


@pytest.mark.parametrize("attribute, value, error", [
    ("numerics", "no-such-profile", ValueError),
    ("batch_invariant", "yes", TypeError),
    ("peer_wheel", 3, TypeError),
    ("tuned_config_dir", 3, TypeError),
])
def test_a_handle_names_a_wrong_attribute_when_it_is_read(attribute, value, error):
    def make(config):
        return config

    setattr(make, attribute, value)
    handle = contract.resolve_factory(make)  # resolving never raises: each field says its own error
    read = {"numerics": "numerics", "batch_invariant": "batch_invariant", "peer_wheel": "peer_wheel",
            "tuned_config_dir": "tuned_configs"}[attribute]
    with pytest.raises(error, match=attribute):
        getattr(handle, read)


# ---- the candidate's process needs none of the judging code (issue 43) ---------------------

# Not in the candidate's view (diffmoe/isolation/boundary.py masks their folders) and refused by
# its import guard (diffmoe/isolation/import_guard.py)
JUDGE_ONLY = ("reference", "diffmoe.oracles", "diffmoe.tolerance")
# What the candidate's process runs: every import counts, lazy ones too (it runs them)
CANDIDATE_PROCESS = ("diffmoe.isolation.sandbox",)
# What a module that defines a factory imports (the faces, the contract's helpers, the kernels'
# packages): only the imports that run at its import count (run_differential's lazy imports of
# the oracles run in the judge, when it is called)
FACTORY_PACKAGES = ("diffmoe.adapters", "diffmoe.problem", "diffmoe.interpreter", "diffmoe.isolation", "diffmoe.frontends",
                    "diffmoe.fuzz", "optimized", "peers")


def _judge_only(name: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in JUDGE_ONLY)


def judge_reached(root: Path, packages=PACKAGES) -> list[str]:
    """Each import chain from the candidate's side into the judge's code, 'a -> b -> judge'."""
    lazy, eager = import_graph(root, packages), import_graph(root, packages, lazy=False)
    faces = {"diffmoe", "diffmoe.contract", *FACES, *FACES.values()}
    starts = [(m, lazy) for m in CANDIDATE_PROCESS if m in lazy]
    starts += [(m, eager) for m in eager if not _judge_only(m) and (m in faces or m.startswith(FACTORY_PACKAGES))]
    chains = set()
    for start, graph in starts:
        via: dict[str, str] = {start: ""}
        todo = [start]
        while todo:
            module = todo.pop()
            for target in sorted(graph.get(module, ())):
                if target in via:
                    continue
                via[target] = module
                if _judge_only(target):
                    chain = [target]
                    while via[chain[-1]]:
                        chain.append(via[chain[-1]])
                    chains.add(" -> ".join(reversed(chain)))
                else:
                    todo.append(target)
    return sorted(chains)


def test_the_candidates_side_imports_no_judging_code():
    """Neither the candidate's process nor a factory's module (through the faces, `from
    diffmoe.runner import run_differential` included) needs diffmoe/oracles/, diffmoe/tolerance/
    or the reference: inside the boundary they are not there."""
    reached = judge_reached(REPO)
    assert not reached, "the candidate's side imports the judge's code:\n" + "\n".join(reached)


@pytest.mark.parametrize("planted, found", [
    ("diffmoe/check/candidate.py", "diffmoe.isolation.sandbox -> diffmoe.check.candidate -> diffmoe.tolerance.compare"),
    ("diffmoe/judge/runner.py", "diffmoe.judge.runner -> diffmoe.tolerance.compare"),
    ("diffmoe/contract.py", "diffmoe.contract -> diffmoe.tolerance.compare"),
    (None, None),
])
def test_the_judge_reach_checker_sees_a_planted_import(tmp_path, planted, found):
    """The rule above can fail: the candidate's process importing the tolerance in a function
    (it runs it), a face or a contract module importing it at its top; and a face's lazy import
    (run_differential's own) is no arrow."""
    pkg = tmp_path / "diffmoe"
    files = {
        "__init__.py": "", "runner.py": "from diffmoe.judge import runner\n",
        "isolation/__init__.py": "", "isolation/sandbox.py": "def serve():\n    from diffmoe.check import candidate\n",
        "check/__init__.py": "", "check/candidate.py": "import torch\n",
        "judge/runner.py": "def run_differential():\n    from diffmoe.tolerance import compare\n",
        "adapters/__init__.py": "", "adapters/contract.py": "",
        "tolerance/__init__.py": "", "tolerance/compare.py": "",
    }
    for path, text in files.items():
        (pkg / path).parent.mkdir(parents=True, exist_ok=True)
        (pkg / path).write_text(text, encoding="utf-8")
    if planted == "diffmoe/check/candidate.py":
        (tmp_path / planted).write_text("def run():\n    from diffmoe.tolerance.compare import compare\n")
    elif planted is not None:
        (tmp_path / planted).write_text("from diffmoe.tolerance.compare import compare\n")
    reached = judge_reached(tmp_path, packages=("diffmoe",))
    assert (found in reached) if found else not reached, reached
