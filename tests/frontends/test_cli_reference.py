"""The CLI reference (docs/cli.md) is generated from the argument parser, so it cannot drift:
`diffmoe.frontends.cli.reference_text()` (every subcommand's usage) must be the block between the
markers. Regenerate it with `python tests/frontends/test_cli_reference.py --write`."""

from __future__ import annotations

import sys
from pathlib import Path

from diffmoe.frontends.cli import reference_text

CLI_PAGE = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
START, END = "<!-- cli-reference:start -->", "<!-- cli-reference:end -->"


def block(text: str) -> str:
    return "```\n" + text + "```"


def page_block(page: str) -> str:
    assert page.count(START) == 1 and page.count(END) == 1, "docs/cli.md needs one cli-reference block"
    return page.split(START, 1)[1].split(END, 1)[0].strip("\n")


def test_the_documented_cli_reference_matches_the_parser():
    assert page_block(CLI_PAGE.read_text()) == block(reference_text()), (
        "docs/cli.md's CLI reference is stale: run `python tests/frontends/test_cli_reference.py --write`")


def test_reference_names_every_subcommand_and_option_the_docs_promise():
    text = reference_text()
    for needle in ("diffmoe check", "diffmoe fuzz", "diffmoe plan", "diffmoe demo", "diffmoe doctor",
                   "diffmoe compile-check", "--device", "--max-experts", "all-remote", "--png"):
        assert needle in text, needle


def write() -> None:
    page = CLI_PAGE.read_text()
    head, rest = page.split(START, 1)
    _, tail = rest.split(END, 1)
    CLI_PAGE.write_text(f"{head}{START}\n{block(reference_text())}\n{END}{tail}")


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    write()
