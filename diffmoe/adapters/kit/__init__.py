"""The adapter kit: what an adapter of a third-party fused MoE needs besides its own call sequence.

    from diffmoe.adapters import kit

    source = kit.PackageSource.wheel("sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl")
    # or kit.PackageSource.folder(path) / kit.PackageSource.distribution("sglang")
    files = kit.load_modules(source, [("pkg.moe", "pkg/moe.py")],
                             stubs=kit.Stubs(["pkg", "pkg_kernels"], values={"pkg.utils": {"is_cuda": lambda: True}}))
    with files.installed():
        files["pkg.moe"].fused_experts(...)

- `loading.py`: a package's modules executed by path from a pinned wheel, an installed
  distribution or a folder, no `__init__` of the package run;
- `stubs.py`: the modules and names an import path needs but never calls, made on demand, each
  a placeholder that raises naming the symbol if it is called;
- `attribution.py`: automatic launch attribution: every Triton launch (through a
  `ReportingKernel` proxy) and every stand-in op of a run reported at its pipeline stage from
  the tensors it reads and writes (`Attribution`), so an adapter names buffers, not launches;
- `supports.py`: what an adapter runs, declared (`Supports(name, Rule(...), ...)`): its
  `supports` attribute and its check, one line naming the field for a config it refuses;
- `standins.py`: torch versions of the CUDA ops fused-MoE kernels call (the alignment, the FP8
  quantisations, silu_and_mul, the top-k sum), each held to the op's stated facts, with the
  conventions kernels differ in as parameters.

Owns nothing but the kit's public names. Must not import an implementation (peers/, optimized/).
"""

from .attribution import ACTIVE, Attribution, ReportingKernel, launch_grid
from .loading import LoadedModules, PackageSource, load_modules
from .stubs import Placeholder, StubModule, Stubs
from .supports import Rule, Supports
from . import standins  # noqa: E402 - the stand-ins are the kit's public module too (docs/plugging-in.md)

__all__ = ["ACTIVE", "Attribution", "LoadedModules", "PackageSource", "Placeholder", "ReportingKernel", "Rule",
           "StubModule", "Stubs", "Supports", "launch_grid", "load_modules", "standins"]
