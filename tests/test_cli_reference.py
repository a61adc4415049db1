"""The README's CLI reference is generated from the argument parser, so it cannot drift:
`diffmoe.frontends.cli.reference_text()` (every subcommand's usage) must be the block between the
markers. Regenerate it with `python tests/test_cli_reference.py --write`."""

from __future__ import annotations

import sys
from pathlib import Path

from diffmoe.frontends.cli import reference_text

README = Path(__file__).resolve().parents[1] / "README.md"
START, END = "<!-- cli-reference:start -->", "<!-- cli-reference:end -->"


def block(text: str) -> str:
    return "```\n" + text + "```"


def readme_block(readme: str) -> str:
    assert readme.count(START) == 1 and readme.count(END) == 1, "README needs one cli-reference block"
    return readme.split(START, 1)[1].split(END, 1)[0].strip("\n")


def test_readme_cli_reference_matches_the_parser():
    assert readme_block(README.read_text()) == block(reference_text()), (
        "README's CLI reference is stale: run `python tests/test_cli_reference.py --write`")


def test_reference_names_every_subcommand_and_option_the_readme_promises():
    text = reference_text()
    for needle in ("diffmoe check", "diffmoe fuzz", "diffmoe plan", "diffmoe demo", "diffmoe doctor",
                   "diffmoe compile-check", "--device", "--max-experts", "all-remote", "--png"):
        assert needle in text, needle


def write() -> None:
    readme = README.read_text()
    head, rest = readme.split(START, 1)
    _, tail = rest.split(END, 1)
    README.write_text(f"{head}{START}\n{block(reference_text())}\n{END}{tail}")


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    write()
