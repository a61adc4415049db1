"""The problem's language: what a MoE call is, named once.

`config.MoEConfig` (every size, scheme and input feature, rebuildable bit for bit),
`vocabulary` (stage and buffer names, shapes, dtypes), `inputs.make_problem` (every input tensor
from the config alone), `edge_cases` (the labelled shapes kernels get wrong) and `numerics` (the
rounding points, their menus and the numerics profiles as data).

Owns the description of a problem. Must not run an implementation or judge anything: every
other folder speaks this language, so it imports none of them.

`from diffmoe.problem import make_problem` keeps working (the public path before the folder
existed): the names of `inputs` are forwarded on first use, so importing `diffmoe.problem.config`
alone costs no torch import.
"""

_SUBMODULES = frozenset({"config", "vocabulary", "inputs", "edge_cases", "numerics"})


def __getattr__(name: str):
    if name.startswith("_") or name in _SUBMODULES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from diffmoe.problem import inputs

    try:
        return getattr(inputs, name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
