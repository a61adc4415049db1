"""The public surface (issue 44 item 2): the verbs at the top, the examples and docs importing
public names only, and every path that moved still working for one release with a warning.

A user's code written against an earlier layout once broke without a word
(`from diffmoe.vocabulary import Buffers`: No module named 'diffmoe.vocabulary'); the tests
below hold each moved path (diffmoe.moved.MOVED) to a DeprecationWarning naming its new home.
"""

from __future__ import annotations

import ast
import importlib
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from diffmoe import moved

REPO = Path(__file__).resolve().parents[2]

# Public modules and the names each offers: its `__all__` (a subpackage named in `__all__` may be
# imported from it). The project's implementations (optimized, reference, peers) are packages of
# their own, not diffmoe's surface.
PUBLIC_MODULES = ("diffmoe", "diffmoe.contract", "diffmoe.config", "diffmoe.runner", "diffmoe.strategies",
                  "diffmoe.pytest_plugin", "diffmoe.adapters", "diffmoe.adapters.kit")


def public_names() -> dict[str, set[str]]:
    return {name: set(importlib.import_module(name).__all__) for name in PUBLIC_MODULES}


def _code_of_markdown(text: str) -> str:
    """The Python code blocks of a Markdown page, joined (lines that do not parse are dropped)."""
    blocks = re.findall(r"^```(?:python|py)\n(.*?)^```", text, flags=re.S | re.M)
    return "\n".join(blocks)


def _imports(source: str) -> list[tuple[str, list[str]]]:
    """(module, names) for each `from M import a, b` (names) and `import M` (no names) of code."""
    try:
        tree = ast.parse(source)
    except SyntaxError:  # a block with an ellipsis placeholder: read its import lines alone
        tree = ast.parse("\n".join(line for line in source.splitlines() if re.match(r"\s*(from|import)\s", line)))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            found += [(a.name, []) for a in node.names]
    return found


def private_imports(files: dict[str, str], offered: dict[str, set[str]]) -> list[str]:
    """'file: import' for each import of a diffmoe module or name that is not public."""
    bad = []
    for where, source in files.items():
        for module, names in _imports(source):
            if module != "diffmoe" and not module.startswith("diffmoe."):
                continue
            if module not in offered:
                bad.append(f"{where}: {module}")
            else:
                bad += [f"{where}: {module}.{n}" for n in names if n not in offered[module]]
    return bad


def project_texts() -> dict[str, str]:
    texts = {str(p.relative_to(REPO)): p.read_text(encoding="utf-8") for p in sorted((REPO / "examples").glob("*.py"))}
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        texts[str(page.relative_to(REPO))] = _code_of_markdown(page.read_text(encoding="utf-8"))
    return texts


def test_examples_and_docs_import_public_names_only():
    bad = private_imports(project_texts(), public_names())
    assert not bad, "examples or docs import a name that is not public:\n" + "\n".join(bad)


def test_the_surface_checker_sees_a_private_import():
    """The rule above can fail: an internal module, a name outside a public module's `__all__`, a
    code block of a page; other packages and public names pass."""
    offered = {"diffmoe": {"MoEConfig"}, "diffmoe.contract": {"Buffers"}}
    files = {
        "a.py": "from diffmoe.problem.vocabulary import Buffers\nimport torch\nfrom peers import vllm\n",
        "b.py": "from diffmoe import MoEConfig, make_problem\nfrom diffmoe.contract import Buffers\n",
        "c.md": _code_of_markdown("text\n```python\nimport diffmoe.judge.runner\n```\n```bash\nfrom diffmoe.x import y\n```\n"),
    }
    assert private_imports(files, offered) == ["a.py: diffmoe.problem.vocabulary", "b.py: diffmoe.make_problem",
                                               "c.md: diffmoe.judge.runner"]


def test_every_public_name_resolves_without_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for module, names in public_names().items():
            for name in names:
                assert getattr(importlib.import_module(module), name) is not None, f"{module}.{name}"


def test_the_verbs_are_at_the_top():
    import diffmoe
    from diffmoe.check.report import Report
    from diffmoe.findings import Finding
    from diffmoe.judge.runner import load_factory, run_differential

    assert (diffmoe.run_differential, diffmoe.load_factory, diffmoe.Report, diffmoe.Finding) == (
        run_differential, load_factory, Report, Finding)
    assert {"run_differential", "load_factory", "Report", "Finding", "MoEConfig", "make_problem"} <= set(diffmoe.__all__)
    assert set(diffmoe.__all__) <= set(dir(diffmoe))
    with pytest.raises(AttributeError, match="no_such_verb"):
        diffmoe.no_such_verb


def _python(code: str, *flags: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONWARNINGS",)}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, *flags, "-c", code], capture_output=True, text=True, env=env, cwd=REPO,
                          timeout=300)


def test_a_new_process_reaches_a_verb_from_the_top():
    """`python -c "import diffmoe; diffmoe.run_differential"`: the verb loads on first use."""
    done = _python("import diffmoe, sys; assert 'diffmoe.judge.runner' not in sys.modules; diffmoe.run_differential; "
                   "print('diffmoe.judge.runner' in sys.modules)")
    assert done.returncode == 0 and done.stdout.strip() == "True", done.stderr


def test_the_users_old_import_works_and_warns_once_naming_the_new_path():
    """The import that broke user code: it runs, says where the module went (at the user's line),
    and `-W error` turns it into the user's own error, not a crash inside diffmoe."""
    code = "from diffmoe.vocabulary import Buffers\nprint(Buffers.W1)"
    done = _python(code, "-W", "default::DeprecationWarning")
    assert done.returncode == 0 and done.stdout.strip(), done.stderr
    assert done.stderr.count("DeprecationWarning") == 1
    assert "<string>:1: DeprecationWarning: diffmoe.vocabulary moved to diffmoe.problem.vocabulary" in done.stderr
    refused = _python(code, "-W", "error::DeprecationWarning")
    assert refused.returncode == 1 and refused.stderr.strip().splitlines()[-1].startswith(
        "DeprecationWarning: diffmoe.vocabulary moved to diffmoe.problem.vocabulary")


@pytest.mark.parametrize("old", sorted(moved.MOVED))
def test_every_moved_path_imports_with_a_warning_naming_its_new_home(old, monkeypatch):
    new = importlib.import_module(moved.MOVED[old])
    monkeypatch.delitem(sys.modules, old, raising=False)
    with pytest.warns(DeprecationWarning, match=re.escape(f"{old} moved to {moved.MOVED[old]}")):
        module = importlib.import_module(old)
    assert module is not new and module.__name__ == old
    for name in [n for n in vars(new) if not n.startswith("_")][:20]:
        assert getattr(module, name) is getattr(new, name)
    assert set(dir(module)) == set(dir(new))
    monkeypatch.delitem(sys.modules, old)
    parent, _, child = old.rpartition(".")
    monkeypatch.delattr(sys.modules[parent], child, raising=False)


def test_a_moved_path_the_finder_does_not_know_is_the_usual_error():
    with pytest.raises(ModuleNotFoundError, match="diffmoe.no_such_module"):
        importlib.import_module("diffmoe.no_such_module")


def test_a_name_a_public_module_stopped_exporting_is_found_with_a_warning():
    """diffmoe.config was the real module: any of its names could be imported from it."""
    from diffmoe.problem.config import quoted

    with pytest.warns(DeprecationWarning, match="diffmoe.config.quoted is not public: import it from diffmoe.problem.config"):
        from diffmoe.config import quoted as old
    assert old is quoted
    with pytest.raises(ImportError, match="no_such_name"):
        from diffmoe.config import no_such_name  # noqa: F401


def test_the_project_imports_no_moved_path():
    """The project's own code, tests and benchmarks use the new homes: a moved path is for users'
    code only, and goes in the next release."""
    bad = []
    for path in sorted(REPO.glob("**/*.py")):
        rel = path.relative_to(REPO)
        if rel.parts[0] in (".venv", "build") or "site-packages" in rel.parts or rel == Path("tests/house/test_public_surface.py"):
            continue
        for module, names in _imports(path.read_text(encoding="utf-8")):
            targets = [module] + [f"{module}.{n}" for n in names]
            bad += [f"{rel}: {t}" for t in targets if t in moved.MOVED]
    assert not bad, "moved paths imported:\n" + "\n".join(bad)


def test_the_pytest_entry_point_is_the_public_plugin():
    """pytest registers `diffmoe.pytest_plugin` (pyproject.toml), the path users also name with -p."""
    text = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    assert re.search(r'^\[project\.entry-points\.pytest11\]\ndiffmoe = "diffmoe\.pytest_plugin"$', text, flags=re.M)
