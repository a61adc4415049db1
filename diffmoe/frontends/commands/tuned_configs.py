"""`diffmoe tuned-configs`: every tuned tile config a peer's release ships, judged.

Owns only the subcommand's wiring: the arguments, the sweep and the report are
diffmoe/tuned_configs/command.py's.
"""

from __future__ import annotations

import argparse

from diffmoe.frontends.commands.feature import feature_parser, run_feature

NAME = "tuned-configs"
HOME = "diffmoe.tuned_configs.command"
HELP = "judge every tuned tile config a peer's release ships (diffmoe/tuned_configs/)"


def add_parser(sub) -> argparse.ArgumentParser:
    return feature_parser(sub, NAME, HELP, HOME, run)


def run(args: argparse.Namespace) -> int:
    return run_feature(HOME, args, NAME)
