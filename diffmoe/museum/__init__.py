"""`diffmoe museum`: released vLLM, SGLang and Liger-Kernel wheels whose MoE bugs diffmoe catches,
each buggy release against the fixed one (a feature folder, as tuned_configs/ is).

exhibits.py holds the exhibit table, the runs of the releases and the command line (its
docstring says what each verdict means). The package exports that module's names, which
`diffmoe.museum` held when it was one module of the flat layout.

Owns nothing itself. Must not hold a project's code: the wheels run as they are (peers/).
"""

from diffmoe.museum.exhibits import *  # noqa: F401,F403 - the flat layout's diffmoe.museum names
