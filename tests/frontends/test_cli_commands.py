"""The subcommands' registry (diffmoe/frontends/commands/): every command module is a row of COMMANDS
with the same small interface, and the parser is built from that list alone (docs/layout.md,
"Adding a command")."""

from __future__ import annotations

import argparse
import importlib
import pkgutil

from diffmoe.frontends import cli, commands


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


def test_the_parser_has_one_subcommand_per_row_in_the_lists_order_each_handled_by_its_run():
    choices = subcommands(cli.build_parser())
    assert list(choices) == [command.NAME for command in commands.COMMANDS]
    for command in commands.COMMANDS:
        assert choices[command.NAME].get_default("handler") is command.run, command.NAME


def test_every_module_that_names_a_command_is_registered():
    """A command module left out of COMMANDS would be dead code; its helpers (fuzz_controls, ...) name none."""
    modules = [importlib.import_module(f"{commands.__name__}.{info.name}") for info in pkgutil.iter_modules(commands.__path__)]
    assert {m for m in modules if hasattr(m, "NAME")} == set(commands.COMMANDS)
    assert all(callable(m.add_parser) and callable(m.run) for m in commands.COMMANDS)


def test_the_usage_line_names_every_command_once():
    assert sorted(commands.usage_choices().strip("{}").split(",")) == sorted(c.NAME for c in commands.COMMANDS)


def test_no_command_names_every_command(capsys):
    """The usage error of a bare `diffmoe` lists every command of the one list (it once named 9 of 11)."""
    from diffmoe.frontends import cli
    from diffmoe.frontends.commands import COMMANDS

    assert cli.main([]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "a command is required:" in err
    assert all(f" {command.NAME}" in err for command in COMMANDS), err
