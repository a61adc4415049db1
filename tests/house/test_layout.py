"""The house rules a reader relies on: the layout table (docs/layout.md) is the tree, every module
opens with what it owns, and a module over 400 lines says why."""

from __future__ import annotations

import ast
import fnmatch
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAYOUT_PAGE = ROOT / "docs" / "layout.md"
PACKAGES = ("diffmoe", "optimized", "reference", "peers")
MAX_LINES = 400
LONG_REASON = "Longer than 400 lines because"


def modules() -> list[Path]:
    return sorted(p for pkg in PACKAGES if (ROOT / pkg).is_dir() for p in (ROOT / pkg).rglob("*.py"))


def layout_paths() -> list[str]:
    text = LAYOUT_PAGE.read_text()
    start = text.index("| path | what it holds |")
    end = text.find("\n\n", start)  # the table ends at a blank line or with the page
    table = text[start:end if end >= 0 else len(text)].splitlines()[2:]
    return [p for row in table for p in re.findall(r"`([^`]+)`", row.split("|")[1])]


def test_every_path_in_the_layout_table_exists():
    missing = [p for p in layout_paths() if not (list(ROOT.glob(p)) if "*" in p else (ROOT / p).exists())]
    assert not missing, f"the layout table (docs/layout.md) names paths that do not exist: {missing}"


def test_every_module_is_in_the_layout_table():
    listed = layout_paths()

    def covered(rel: str) -> bool:
        return any(rel == p or fnmatch.fnmatch(rel, p) or (p.endswith("/") and rel.startswith(p)) for p in listed)

    missing = [str(m.relative_to(ROOT)) for m in modules()
               if m.name not in ("__init__.py", "__main__.py") and not covered(str(m.relative_to(ROOT)))]
    assert not missing, f"modules the layout table (docs/layout.md) does not mention: {missing}"


def test_every_module_opens_with_what_it_owns():
    """A docstring that says what the module holds, and what it owns or must not touch."""
    bare = [str(m.relative_to(ROOT)) for m in modules()
            if not re.search(r"\bOwns\b|\bMust not\b|\bmust not\b", ast.get_docstring(ast.parse(m.read_text())) or "")]
    assert not bare, f"modules whose docstring does not say what they own or must not touch: {bare}"


def test_a_module_over_400_lines_says_why():
    long = {str(m.relative_to(ROOT)): n for m in modules() if (n := len(m.read_text().splitlines())) > MAX_LINES}
    silent = [f"{path} ({n} lines)" for path, n in long.items()
              if LONG_REASON not in (ast.get_docstring(ast.parse((ROOT / path).read_text())) or "")]
    assert not silent, f"over {MAX_LINES} lines without '{LONG_REASON} ...' in the docstring: {silent}"


# ---- the tests mirror the folders (issue 44, item 6) ---------------------------------------------

TESTS = ROOT / "tests"
# tests/ folders that are no folder of the code: the rules of the house, the shared helpers, the mutants
TEST_ONLY_FOLDERS = {"house", "support", "bug_zoo"}


def misplaced_tests(tests: Path, root: Path) -> list[str]:
    """What breaks the tests' layout: a file at tests/'s top but conftest.py, a folder that is neither a
    concept folder of diffmoe/ (or a top-level package) nor one of TEST_ONLY_FOLDERS, a helper (a module
    that is not test_*.py) outside tests/support/, and a test inside it."""
    concepts = {p.name for p in (root / "diffmoe").iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    concepts |= {p for p in PACKAGES if p != "diffmoe"} | TEST_ONLY_FOLDERS
    wrong = [f"tests/{p.name}: only conftest.py sits at the top" for p in tests.glob("*.py") if p.name != "conftest.py"]
    for folder in sorted(p for p in tests.iterdir() if p.is_dir() and p.name != "__pycache__"):
        if folder.name not in concepts:
            wrong.append(f"tests/{folder.name}/: no concept folder of the code is called so")
        for module in sorted(folder.rglob("*.py")):
            helper, in_support = not module.name.startswith("test_"), folder.name == "support"
            if helper != in_support and module.name != "conftest.py":
                wrong.append(f"{module.relative_to(tests.parent)}: " + ("a helper belongs in tests/support/" if helper
                                                                         else "a test belongs in its concept's folder"))
    return wrong


def test_the_tests_mirror_the_folders():
    assert misplaced_tests(TESTS, ROOT) == []


def test_the_test_layout_checker_sees_a_misplaced_file(tmp_path):
    tests = tmp_path / "tests"
    for folder in ("oracles", "support", "gadgets"):
        (tests / folder).mkdir(parents=True)
    (tmp_path / "diffmoe" / "oracles").mkdir(parents=True)
    (tmp_path / "diffmoe" / "oracles" / "__init__.py").write_text("")
    (tests / "test_loose.py").write_text("")
    (tests / "oracles" / "helper.py").write_text("")
    (tests / "oracles" / "test_races.py").write_text("")
    (tests / "support" / "test_here.py").write_text("")
    assert misplaced_tests(tests, tmp_path) == [
        "tests/test_loose.py: only conftest.py sits at the top",
        "tests/gadgets/: no concept folder of the code is called so",
        "tests/oracles/helper.py: a helper belongs in tests/support/",
        "tests/support/test_here.py: a test belongs in its concept's folder",
    ]
