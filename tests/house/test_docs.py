"""The documentation holds together: README.md is a front page of at most 300 lines, the MkDocs
site (mkdocs.yml, docs/) lists every page once and no page it lacks, every relative link in the
README and the pages reaches an existing file and heading, the pages link only to pages (a file
outside docs/ is named as code, which MkDocs leaves alone), and the README's own-kernel example
runs, and every documented `.venv/bin/diffmoe` / `.venv/bin/python` command parses or names files
that exist. With the docs extra installed (`pip install -e '.[docs]'`) the site also builds with
`mkdocs build --strict`, as .ci/run builds it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest
from hang_bounds import SUBPROCESS_HANG_S

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MKDOCS_YML = ROOT / "mkdocs.yml"
MAX_README_LINES = 300

FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.S | re.M)
CODE_SPAN = re.compile(r"`[^`]*`")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t]*#*[ \t]*$", re.M)


def pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def nav_pages() -> list[str]:
    """The .md files mkdocs.yml's nav names (`- Title: page.md` lines), in order."""
    text = MKDOCS_YML.read_text()
    nav = text[text.index("\nnav:"):]
    return re.findall(r"^\s*-\s*(?:[^:\n]+:\s*)?(\S+\.md)\s*$", nav, re.M)


def prose(text: str) -> str:
    """The text without fenced blocks and code spans: what a renderer would read links from."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def slugs(heading: str) -> set[str]:
    """The anchors a heading gets: Python-Markdown's toc (MkDocs) and GitHub's (the README)."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip()
    ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    toc = re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", ascii_text).strip().lower())
    github = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
    return {toc, github}


def anchors(path: Path) -> set[str]:
    found = set()
    for heading in HEADING.findall(FENCE.sub("", path.read_text())):
        found |= slugs(heading)
    return found


def links(path: Path) -> list[str]:
    return [t for t in LINK.findall(prose(path.read_text())) if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


def test_the_readme_is_a_front_page_of_at_most_300_lines():
    lines = len(README.read_text().splitlines())
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines: move the detail to a page in docs/"


def code_blocks(text: str, language: str | None = None) -> list[str]:
    """The bodies of the ``` blocks of `text` (only those opened as ```language, when given)."""
    opener = re.escape(language) if language is not None else r"[^\n]*"
    return re.findall(rf"^```{opener}\n(.*?)^```", text, re.S | re.M)


def test_the_readme_keeps_the_two_quick_start_commands_ci_and_the_demo_read():
    text = README.read_text()
    after_marker = text.split("<!-- test-command -->\n", 1)[1]
    assert after_marker.startswith("```bash\n") and "-m pytest" in after_marker.split("```", 2)[1]
    bash_lines = [line for block in code_blocks(text, "bash") for line in block.splitlines()]
    demo = next(line for line in bash_lines if line.rstrip().endswith("diffmoe demo"))
    assert demo.startswith("[ -x .venv/bin/python ] ||"), demo


def test_the_docs_front_page_shows_the_readmes_two_commands_word_for_word():
    """docs/index.md repeats the quick start: a reader of the site runs what a reader of the README runs."""
    quick = [line for block in code_blocks(README.read_text(), "bash") for line in block.splitlines()
             if line.startswith("[ -x .venv/bin/python ] ||")]
    site = [line for block in code_blocks((DOCS / "index.md").read_text(), "bash") for line in block.splitlines()
            if line.startswith("[ -x .venv/bin/python ] ||")]
    assert len(quick) == 2 and site == quick, site


def repeated_lines(page: str, readme: str) -> list[str]:
    """The lines of `page` (40 characters or more, but the quick start's commands) that `readme` holds too."""
    own = {line.strip() for line in readme.splitlines()}
    return [line.strip() for line in page.splitlines()
            if len(line.strip()) >= 40 and not line.startswith("[ -x .venv/bin/python ] ||") and line.strip() in own]


def test_the_docs_front_page_does_not_repeat_the_readme():
    """docs/index.md is the site's map, not a second README: beyond the two commands, no line of it is the
    README's (the pipeline picture lives on docs/flow.md)."""
    assert repeated_lines((DOCS / "index.md").read_text(), README.read_text()) == []
    assert repeated_lines("a line the readme holds word for word, long enough\n", "a line the readme holds word for word, long enough\n")


def test_every_nav_page_exists_and_every_page_is_in_the_nav():
    nav = nav_pages()
    assert nav, "mkdocs.yml has no nav"
    assert len(nav) == len(set(nav)), f"pages listed twice in the nav: {sorted({p for p in nav if nav.count(p) > 1})}"
    missing = [p for p in nav if not (DOCS / p).is_file()]
    assert not missing, f"mkdocs.yml's nav lists pages docs/ does not have: {missing}"
    unlisted = [str(p.relative_to(DOCS)) for p in pages() if str(p.relative_to(DOCS)) not in nav]
    assert not unlisted, f"pages in docs/ that mkdocs.yml's nav does not list: {unlisted}"


@pytest.mark.parametrize("path", [README, *pages()], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_reaches_a_file_and_a_heading(path):
    broken = []
    for target in links(path):
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading with that anchor in {dest.relative_to(ROOT)}")
    assert not broken, f"{path.relative_to(ROOT)}: {broken}"


@pytest.mark.parametrize("path", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_pages_link_only_inside_docs(path):
    """A link to a repository file outside docs/ is a broken link on the built site: name such a
    file as code (`tests/support/bug_zoo.py`) instead."""
    outside = [t for t in links(path)
               if t.partition("#")[0] and DOCS.resolve() not in (path.parent / t.partition("#")[0]).resolve().parents]
    assert not outside, f"{path.relative_to(ROOT)} links outside docs/: {outside}"


def test_the_readme_own_kernel_example_runs(monkeypatch):
    """The pytest example under "Testing your own kernel", run as the README says: from the root."""
    section = README.read_text().split("## Testing your own kernel", 1)[1]
    code = re.search(r"^```python\n(.*?)^```", section, re.S | re.M).group(1)
    monkeypatch.chdir(ROOT)
    namespace: dict = {"__name__": "readme_example"}
    exec(compile(code, "README.md (Testing your own kernel)", "exec"), namespace)
    tests = [f for name, f in namespace.items() if name.startswith("test_") and callable(f)]
    assert tests, "the README's own-kernel example defines no test"
    for test in tests:
        test()


def test_the_site_builds_strictly(tmp_path):
    for module in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python"):
        pytest.importorskip(module, reason=f"the docs extra is not installed ({module}): "
                                           "pip install -e '.[docs]' to build the site here")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=SUBPROCESS_HANG_S,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ---- every documented command is one this repository runs -------------------------------------

COMMAND_START = re.compile(r"^(?:[A-Z_]+=\S+\s+)*(\.venv/bin/(?:diffmoe|python)\b.*)$")


def documented_commands() -> list[tuple[str, str]]:
    """(page, command) for every line of a code block in README.md and docs/ that runs
    `.venv/bin/diffmoe` or `.venv/bin/python` (after optional VAR=value assignments), the
    README's install lines included (from their last `&&` on), comments and usage lines aside."""
    found = []
    for path in [README, *pages()]:
        for block in code_blocks(path.read_text()):
            for line in block.splitlines():
                line = line.split("  #", 1)[0].split(" # ", 1)[0].strip()
                line = line.rsplit("&& ", 1)[-1].strip()
                m = COMMAND_START.match(line)
                if m:
                    found.append((str(path.relative_to(ROOT)), m.group(1)))
    return found


def test_the_docs_show_commands():
    """The extraction below finds the documented commands (it would pass vacuously otherwise)."""
    commands = [c for _, c in documented_commands()]
    assert any(c.startswith(".venv/bin/diffmoe check ") for c in commands)
    assert any(c.startswith(".venv/bin/python bench/") for c in commands)
    assert len(commands) >= 30, commands


@pytest.mark.parametrize(("page", "command"), documented_commands(), ids=lambda v: v[:80])
def test_every_documented_command_is_one_this_repository_runs(page, command):
    """`.venv/bin/diffmoe ...` parses with the CLI's own parser (flags, choices, subcommands);
    `.venv/bin/python SCRIPT` and `-m pytest PATH` name files that exist. Running them all would
    take hours (campaigns, benchmarks); what breaks silently when code moves is the text."""
    import shlex

    from diffmoe.frontends.cli import build_parser

    argv = shlex.split(command)
    if argv[0] == ".venv/bin/diffmoe":
        try:
            build_parser().parse_args(argv[1:])
        except SystemExit as exc:
            pytest.fail(f"{page}: `{command}` does not parse (exit {exc.code})")
        return
    rest = argv[1:]
    if rest[:2] == ["-m", "pytest"]:
        paths = [a for a in rest[2:] if not a.startswith("-") and ("/" in a or a.endswith(".py"))]
        paths = [p for p in paths if not p.upper().endswith(".JSON")]
    else:
        paths = rest[:1]
    missing = [p for p in paths if not (ROOT / p).exists()]
    assert not missing, f"{page}: `{command}` names files that do not exist: {missing}"
