"""A feature folder's subcommand (museum/, tuned_configs/): the folder's command module names its
description, adds its arguments and runs; the subcommand only wires it in.

Owns that wiring, for each feature command module here to share. Must not hold a feature's logic.
"""

from __future__ import annotations

import argparse
import importlib
from typing import Callable

from diffmoe.frontends.exits import PROG


def feature_parser(sub, name: str, help_text: str, home: str, run: Callable) -> argparse.ArgumentParser:
    """The subparser of `name`, with `home`'s DESCRIPTION and add_arguments (the module is read when
    the parser is built: its tables name the arguments)."""
    module = importlib.import_module(home)
    parser = sub.add_parser(name, help=help_text, description=module.DESCRIPTION)
    module.add_arguments(parser)
    parser.set_defaults(handler=run)
    return parser


def run_feature(home: str, args: argparse.Namespace, name: str) -> int:
    return importlib.import_module(home).run(args, prog=f"{PROG} {name}")
