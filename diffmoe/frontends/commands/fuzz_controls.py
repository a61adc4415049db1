"""`diffmoe fuzz`'s field bounds (check's config flags as N, LO..HI or A[,B]) and its waivers (--waive,
--waive-file, --keep-going): the flags, their parsing into FieldBounds and Waivers, and the probe that
the bounds leave a config the implementation's `supports` runs. Not a command: part of commands/fuzz.py.

Owns those flags' parsing and its usage errors; the bounds and waivers themselves are
diffmoe/fuzz/bounds.py's and diffmoe/fuzz/waivers.py's.
"""

from __future__ import annotations

import argparse

from diffmoe.problem.config import MAX_SWIGLU_LIMIT
from diffmoe.frontends import model_flags
from diffmoe.frontends.config_flags import CONFIG_FLAGS, numerics_spec, parse_expert_map
from diffmoe.frontends.exits import UsageError
from diffmoe.frontends.flags import _positive_int, _read_small_text

# Config flags a fuzz does not bound (yet): the granularity axes and the routed scaling factor are drawn
# by the strategies (diffmoe.fuzz.strategies) and pinned per check only.
UNBOUNDED_FUZZ_FLAGS = ("weight_scales", "act_scales", "routed_scaling_factor")

# `diffmoe fuzz` bounds: check's config flags, each taking N or LO..HI (integers) or A[,B] (choices).
# The problem seed is --problem-seed: fuzz's --seed is the search's own seed.
FUZZ_BOUND_FLAGS = {flag: name for flag, name in CONFIG_FLAGS.items()
                    if flag not in ("seed", "planner", *UNBOUNDED_FUZZ_FLAGS)}
FUZZ_BOUND_FLAGS["problem_seed"] = "seed"
FUZZ_SWITCHES = ("renormalize", "tie_heavy")  # --X / --no-X pins them


def _add_fuzz_controls(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("field bounds (check's config flags: N or LO..HI for integers, A or A,B for choices; "
                             "each field drawn only within its bound)")
    model_flags.add_flags(g)
    for flag, name in FUZZ_BOUND_FLAGS.items():
        option = "--" + flag.replace("_", "-")
        if name == "fused":
            fused = g.add_mutually_exclusive_group()
            fused.add_argument("--fused", dest="fused", action="store_const", const=True, help="draw only fused configs")
            fused.add_argument("--unfused", dest="fused", action="store_const", const=False, help="draw only unfused configs")
        elif flag in FUZZ_SWITCHES:
            g.add_argument(option, action=argparse.BooleanOptionalAction, default=None, help=f"pin {name} on (or off)")
        elif name == "expert_map":
            g.add_argument(option, metavar="A,B,...", help="pin the expert map (write --expert-map=0,-1,1); pins E to its length")
        elif name in ("numerics", "swiglu_limit"):
            g.add_argument(option, metavar="VALUE", help=f"pin {name}")
        else:
            from diffmoe.fuzz.bounds import CHOICE_FIELDS, INT_FIELDS

            if name in INT_FIELDS:
                lo, hi = INT_FIELDS[name]
                g.add_argument(option, metavar="N|LO..HI", help=f"bound {name} within [{lo}, {hi}]")
            else:
                g.add_argument(option, metavar="A[,B]", help=f"{name}: one or more of {', '.join(map(str, CHOICE_FIELDS[name]))}")
    w = p.add_argument_group("known findings and several failures")
    w.add_argument("--waive", action="append", metavar="ORACLE@STAGE",
                   help="search past findings of ORACLE at STAGE (ORACLE alone or ORACLE@*: at any stage); repeatable")
    w.add_argument("--waive-file", metavar="FILE", help="waivers, one ORACLE@STAGE per line, # comments allowed")
    w.add_argument("--keep-going", type=_positive_int, default=1, metavar="N",
                   help="collect up to N distinct failures (by oracle@stage), each shrunk, each with its replay line "
                        "(default 1: stop at the first; runs with --workers 1)")


def fuzz_bounds(args: argparse.Namespace):
    """The FieldBounds the fuzz's bound flags describe; UsageError naming the flag and the allowed range."""
    from diffmoe.fuzz.bounds import CHOICE_FIELDS, INT_FIELDS, FieldBounds, parse_choices, parse_int_bound

    ranges: dict[str, tuple[int, int]] = {}
    values: dict[str, tuple] = {}
    try:
        for flag, name in FUZZ_BOUND_FLAGS.items():
            text = getattr(args, flag, None)
            if text is None:
                continue
            option = "--" + flag.replace("_", "-")
            if name in INT_FIELDS:
                ranges[name] = parse_int_bound(name, text, option)
            elif isinstance(text, bool):
                values[name] = (text,)
            elif name in CHOICE_FIELDS:
                values[name] = parse_choices(name, text, option)
            elif name == "expert_map":
                values[name] = (parse_expert_map(text),)
            elif name == "numerics":
                values[name] = (numerics_spec(text),)
            else:  # swiglu_limit
                try:
                    values[name] = (float(text),)
                except ValueError:
                    raise ValueError(f"{option} must be a number in (0, {MAX_SWIGLU_LIMIT:g}], got {text[:60]!r}") from None
        model_flags.fuzz_pins(args, ranges, values)  # --model's fields where no flag bounds them, --ep's map
        return FieldBounds(ranges=ranges, values=values)
    except ValueError as exc:
        raise UsageError(str(exc)) from None



# Draws tried for a config the implementation's `supports` accepts within the bounds: the fuzz itself
# gives up (Hypothesis's Unsatisfiable) well before this many consecutive refusals would pass.
SUPPORTED_PROBE_EXAMPLES = 500


def _bounds_leave_a_supported_config(strategy, bounds, factory, name: str) -> None:
    """A usage error (one line, naming the bounds and one refusal) when every bounded draw is a
    config the implementation's own `supports` refuses (`fuzz --impl vllm --quant fp8-token --fused`):
    otherwise the fuzz would end in an internal error, every example rejected."""
    from diffmoe.contract import SUPPORTS, factory_attribute, unsupported

    if factory is None or factory_attribute(factory, SUPPORTS) is None:
        return
    from hypothesis import HealthCheck, Phase, find, settings
    from hypothesis.errors import NoSuchExample, Unsatisfiable

    refusals: list[str] = []

    def runs(config) -> bool:
        reason = unsupported(factory, config)
        if reason is not None:
            refusals.append(reason)
        return reason is None

    try:
        find(strategy, runs, settings=settings(max_examples=SUPPORTED_PROBE_EXAMPLES, database=None, derandomize=True,
                                               phases=[Phase.generate], suppress_health_check=list(HealthCheck)))
    except (NoSuchExample, Unsatisfiable):
        why = f": {refusals[0]}" if refusals else ""
        if bounds:
            raise UsageError(f"{name} does not run any config within the bounds ({bounds.describe()}){why} "
                             "(its `supports`; widen or change the bounds)") from None
        raise UsageError(f"{name} does not run any config the fuzz draws{why} (its `supports` refused "
                         f"all {len(refusals)} draws; narrow the fuzz with field bounds such as --quant to what it runs)") from None


def fuzz_waivers(args: argparse.Namespace):
    """The Waivers of --waive and --waive-file; UsageError naming the flag (or file line) and the form."""
    from diffmoe.fuzz.waivers import MAX_WAIVER_FILE_CHARS, Waivers, parse_waiver, parse_waiver_text

    try:
        items = [parse_waiver(text) for text in args.waive or ()]
        if args.waive_file is not None:
            text = _read_small_text(args.waive_file, "waiver file", MAX_WAIVER_FILE_CHARS)
            if len(text) > MAX_WAIVER_FILE_CHARS:
                raise UsageError(f"waiver file {args.waive_file} is larger than {MAX_WAIVER_FILE_CHARS} characters")
            items += parse_waiver_text(text, f"--waive-file {args.waive_file}")
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return Waivers(items)
