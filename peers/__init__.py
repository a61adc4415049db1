"""Third-party fused-MoE kernels behind diffmoe's plug-in contract, one module per peer and pinned version.

    peers.vllm_0_33:make      vLLM 0.33.0's Triton fused MoE (TritonExperts), from its own wheel's files
    peers.lmdeploy_0_18:make  lmdeploy 0.18.0's blocked-FP8 fused MoE, from its own wheel's files

A peer's code is never copied here: `diffmoe peers fetch NAME` (diffmoe/peer_wheels.py) caches
the few files its adapter loads, by path, from the pinned wheel. Without a GPU the Triton
kernels run under the interpreter: the switch must be set before Triton is first imported,
hence here, before any peer module is.

Owns the package's entry point and what every adapter shares: `PeerFiles` (a peer's files
loaded once per cache root and device) and `modules_installed` (its module names resolved to
those files while it runs), the interpreter set-up, the check of a
problem against the built implementation, the refusal of config fields an adapter does not wire
(`refuse_set_fields`), and the `supports` answer from an adapter's check. Must not hold third-party source or judge a peer's results.
"""

import contextlib
import os
import sys
import threading

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@contextlib.contextmanager
def modules_installed(modules: dict):
    """`sys.modules` maps each name in `modules` to its module while inside (a peer's files import
    their siblings, some at call time); every name is put back as it was on the way out."""
    saved = {name: sys.modules.get(name) for name in modules}
    sys.modules.update(modules)
    try:
        yield
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


# Fields a problem may differ in from the config an adapter was built for (as optimized/moe.py).
PER_CALL_FIELDS = ("num_tokens", "seed", "skew")


def interpreting() -> bool:
    """Whether Triton runs kernels under its interpreter (its own knob, read at call time)."""
    from triton import knobs

    return bool(knobs.runtime.interpret)


def install_interpreter_fixes() -> None:
    """As optimized/launch.py: under the interpreter, diffmoe's exact casts and dots, the
    probe-gated fixes third-party kernels need, and the interpreter fast path."""
    if not interpreting():
        return
    from diffmoe import interpreter_fixes, interpreter_speed

    interpreter_speed.install()
    interpreter_fixes.install()


def check_problem(impl, problem) -> None:
    """ValueError unless `problem` fits `impl` (its config but PER_CALL_FIELDS, at most its
    max_tokens, on its device)."""
    base = {f: v for f, v in problem.config.to_dict().items() if f not in PER_CALL_FIELDS}
    mine = {f: v for f, v in impl.config.to_dict().items() if f not in PER_CALL_FIELDS}
    if base != mine:
        raise ValueError(f"problem config differs from the implementation's in {sorted(f for f in base if base[f] != mine[f])}")
    if problem.num_tokens > impl.max_tokens:
        raise ValueError(f"num_tokens must be in [0, {impl.max_tokens}], got {problem.num_tokens}")
    if problem.device != impl.device:
        raise ValueError(f"problem is on {problem.device}, the implementation runs on {impl.device}")


def refuse_set_fields(config, name: str, reasons: dict) -> None:
    """ValueError for the first field of `reasons` (field -> why) that `config` sets to other than
    MoEConfig's default: the adapter `name` does not run it, for that reason."""
    defaults = type(config).__dataclass_fields__
    for field, why in reasons.items():
        default = defaults[field].default
        if getattr(config, field) != default:
            raise ValueError(f"{field} must be {default!r} for {name}: {why}")


def supports_from(check_supported):
    """diffmoe.contract's `supports(config)` from an adapter's check: None, or the check's message."""
    def supports(config) -> str | None:
        try:
            check_supported(config)
        except ValueError as exc:
            return str(exc)
        return None

    return supports


class PeerFiles:
    """A peer's files, loaded once per (class, cache root, device key). A subclass names its
    `peer` (diffmoe.peer_wheels.PEERS), loads its modules into `self.modules` in
    `__init__(root, device)`, and may key devices coarser than `str(device)` (`device_key`)."""

    peer: str
    modules: dict
    _loaded: dict = {}
    _lock = threading.Lock()

    @staticmethod
    def device_key(device) -> str:
        return str(device)

    @classmethod
    def get(cls, device):
        from diffmoe import peer_wheels

        root = peer_wheels.peer_root(cls.peer)  # one line naming `diffmoe peers fetch <peer>` when missing
        key = (cls, str(root), cls.device_key(device))
        with cls._lock:
            if key not in cls._loaded:
                install_interpreter_fixes()
                cls._loaded[key] = cls(root, device)
            return cls._loaded[key]

    @contextlib.contextmanager
    def installed(self):
        """The peer's module names resolve to these modules (its files import some at call time)."""
        with modules_installed(self.modules):
            yield self
