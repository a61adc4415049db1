"""`diffmoe tuned-configs`: every tuned tile config a peer's release ships, judged.

Owns only the subcommand's wiring: the arguments, the sweep and the report are
diffmoe/tuned_configs/command.py's.
"""

from __future__ import annotations

import argparse

from diffmoe.frontends.exits import PROG

NAME = "tuned-configs"


def add_parser(sub) -> argparse.ArgumentParser:
    from diffmoe.tuned_configs import command as tuned_configs_module

    tuned = sub.add_parser(
        NAME, help="judge every tuned tile config a peer's release ships (diffmoe/tuned_configs/)",
        description=tuned_configs_module.DESCRIPTION)
    tuned_configs_module.add_arguments(tuned)
    tuned.set_defaults(handler=run)
    return tuned


def run(args: argparse.Namespace) -> int:
    from diffmoe.tuned_configs.command import run as tuned_configs_run

    return tuned_configs_run(args, prog=f"{PROG} tuned-configs")
