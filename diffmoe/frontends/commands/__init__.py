"""The `diffmoe` subcommands, one module each, and COMMANDS, the one list that registers them.

Each command module has NAME (the subcommand), add_parser(sub) (its subparser, from the subparsers
action of diffmoe/frontends/cli.py's build_parser, with `run` set as its handler) and run(args) (the
exit status). Adding a command: one module here and one row in COMMANDS. fuzz_controls.py,
fuzz_plan_phase.py and fuzz_output.py are not commands: they are parts of fuzz.py.

Owns which commands exist and their order; must not hold a command's arguments or logic.
"""

from __future__ import annotations

from diffmoe.frontends.commands import (
    check, compile_check, demo, doctor, fuzz, models, museum, numerics, peers, plan, tuned_configs,
)

# In the order `diffmoe --help` lists them.
COMMANDS = (
    check,
    fuzz,
    plan,
    demo,
    doctor,
    peers,
    museum,
    models,
    tuned_configs,
    numerics,
    compile_check,
)

# The usage line (`diffmoe [-h] {check,...}`) keeps the order it had: these first, compile-check
# beside doctor; every other command follows in COMMANDS' order, a new one at the end.
USAGE_FIRST = ("check", "fuzz", "plan", "demo", "doctor", "compile-check")


def usage_choices() -> str:
    """The `{check,fuzz,...}` the usage line and the subcommands' heading show."""
    names = [command.NAME for command in COMMANDS]
    return "{" + ",".join([*USAGE_FIRST, *(name for name in names if name not in USAGE_FIRST)]) + "}"
