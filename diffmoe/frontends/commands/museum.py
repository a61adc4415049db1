"""`diffmoe museum`: real vLLM, SGLang and Liger-Kernel bugs, each buggy release against the fixed one.

Owns only the subcommand's wiring: the exhibits, their arguments and the run are
diffmoe/museum/exhibits.py's.
"""

from __future__ import annotations

import argparse

from diffmoe.frontends.commands.feature import feature_parser, run_feature

NAME = "museum"
HOME = "diffmoe.museum.exhibits"
HELP = ("real vLLM, SGLang and Liger-Kernel bugs: each buggy release must fail as recorded, the fixed one pass "
        "(diffmoe/museum/exhibits.py)")


def add_parser(sub) -> argparse.ArgumentParser:
    return feature_parser(sub, NAME, HELP, HOME, run)


def run(args: argparse.Namespace) -> int:
    return run_feature(HOME, args, NAME)
