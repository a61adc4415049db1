"""What an adapter runs, declared: `Supports(name, Rule(...), ...)` is a factory's `supports` attribute
(diffmoe.contract.SUPPORTS) and its `check_supported`, from rules instead of a hand-written ladder.

    supports = Supports("my kernel",
        Rule("quant", ("bf16", "fp8-block"), "it has no per-tensor or per-token path"),
        Rule("fused", (False,), "silu and the down input's quant are two kernels"),
        Rule("hidden", refused=(128,), when=lambda c: c.quant == "fp8-block", condition="quant='fp8-block'",
             why="a whole-row group takes another quant"),
        Rule("swiglu_limit", why="its SwiGLU has no clamp"),     # must stay at MoEConfig's default
    )
    make.supports = supports          # None, or the first broken rule's one line

Each rule, where `when` holds (always, by default), holds one field to the values `allowed` (a tuple,
or a function of the config giving one), or away from the values `refused`; with neither, to
MoEConfig's default. The first broken rule is the refusal, one line naming the field, what it must
be, under which condition, for whom, why, and what the config has: "fused must be false with
quant='bf16' for vLLM 0.33.0: ..., got True". `fields()` lists what is constrained, for docs and tests.

Owns the rule and its message. Must not import an implementation.
"""

from __future__ import annotations

from dataclasses import dataclass, fields as dataclass_fields
from typing import Callable

from diffmoe.problem.config import MoEConfig


def _word(value) -> str:
    return str(value).lower() if isinstance(value, bool) else repr(value)


def _words(values) -> str:
    words = [_word(v) for v in values]
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


@dataclass(frozen=True)
class Rule:
    """One constraint on one config field (module docstring)."""

    field: str
    allowed: tuple | Callable[[MoEConfig], tuple] | None = None
    why: str = ""
    when: Callable[[MoEConfig], bool] | None = None
    condition: str = ""  # `when` in words, for the message ("quant='fp8-block'")
    refused: tuple = ()

    def __post_init__(self) -> None:
        known = {f.name for f in dataclass_fields(MoEConfig)}
        if self.field not in known:
            raise ValueError(f"field must be a MoEConfig field, got {self.field!r}")
        if self.allowed is not None and self.refused:
            raise ValueError(f"a rule on {self.field} takes allowed or refused values, not both")

    def broken(self, config: MoEConfig, name: str) -> str | None:
        """The refusal's line when `config` breaks this rule, else None."""
        if self.when is not None and not self.when(config):
            return None
        value = getattr(config, self.field)
        if self.refused:
            if value not in self.refused:
                return None
            expected = f"other than {_words(self.refused)}"
        else:
            allowed = self.allowed(config) if callable(self.allowed) else self.allowed
            if allowed is None:
                allowed = (MoEConfig.__dataclass_fields__[self.field].default,)
            if value in allowed:
                return None
            expected = _words(allowed)
        where = f" with {self.condition}" if self.condition else ""
        why = f": {self.why}" if self.why else ""
        return f"{self.field} must be {expected}{where} for {name}{why}, got {_word(value)}"


class Supports:
    """A factory's `supports(config)`: None when every rule holds, else the first broken rule's line;
    `check(config)` raises it as a ValueError (an adapter's constructor)."""

    def __init__(self, name: str, *rules: Rule) -> None:
        if not all(isinstance(r, Rule) for r in rules):
            raise TypeError("rules must be Rule objects")
        self.name, self.rules = name, rules

    def __call__(self, config: MoEConfig) -> str | None:
        for rule in self.rules:
            refused = rule.broken(config, self.name)
            if refused is not None:
                return refused
        return None

    def check(self, config: MoEConfig) -> None:
        refused = self(config)
        if refused is not None:
            raise ValueError(refused)

    def fields(self) -> tuple[str, ...]:
        """The constrained fields, each once, in rule order."""
        return tuple(dict.fromkeys(r.field for r in self.rules))

    def __repr__(self) -> str:
        return f"Supports({self.name!r}, {len(self.rules)} rules on {', '.join(self.fields())})"
