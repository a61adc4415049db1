"""`diffmoe museum`: real vLLM, SGLang and Liger-Kernel bugs, each buggy release against the fixed one.

Owns only the subcommand's wiring: the exhibits, their arguments and the run are
diffmoe/museum/exhibits.py's.
"""

from __future__ import annotations

import argparse

from diffmoe.frontends.exits import PROG

NAME = "museum"


def add_parser(sub) -> argparse.ArgumentParser:
    from diffmoe.museum import exhibits as museum_module  # the exhibit table names the arguments

    museum = sub.add_parser(
        NAME, help="real vLLM, SGLang and Liger-Kernel bugs: each buggy release must fail as recorded, the fixed one pass (diffmoe/museum/exhibits.py)",
        description=museum_module.DESCRIPTION)
    museum_module.add_arguments(museum)
    museum.set_defaults(handler=run)
    return museum


def run(args: argparse.Namespace) -> int:
    from diffmoe.museum.exhibits import run as museum_run

    return museum_run(args, prog=f"{PROG} museum")
