"""`diffmoe peers fetch NAME [--wheel FILE.whl] | diffmoe peers list`: the peers' pinned wheels.

Owns only the subcommand's wiring: its small parser and the cache are diffmoe/adapters/peer_wheels.py's.
"""

from __future__ import annotations

import argparse

from diffmoe.frontends.exits import PROG

NAME = "peers"


def add_parser(sub) -> argparse.ArgumentParser:
    peers = sub.add_parser(
        NAME, help="fetch and list the peers' pinned wheels (third-party kernels run behind the contract)",
        description="diffmoe peers fetch NAME [--wheel FILE.whl] | diffmoe peers list (diffmoe/adapters/peer_wheels.py)", add_help=False)
    peers.add_argument("rest", nargs=argparse.REMAINDER, help="fetch NAME [--wheel FILE.whl], or list")
    peers.set_defaults(handler=run)
    return peers


def run(args: argparse.Namespace) -> int:
    from diffmoe.adapters.peer_wheels import main as peers_main

    return peers_main(args.rest, prog=f"{PROG} peers")
