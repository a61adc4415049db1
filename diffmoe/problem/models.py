"""Real models' MoE shapes as named presets (`--model NAME`), and expert-parallel placement (`--ep R/N`).

A preset sets the fields a model's published config fixes: the routed experts E, experts per token
K, hidden size H, expert intermediate size I, the shared experts (fused into the routed set as
diffmoe models them: E+S experts, K+S slots, the last S slots of every token picking the shared
experts with weight 1), the routed scaling factor, the SwiGLU clamp, the quant scheme of the
checkpoint engines load, and the router weights' shape (every preset model normalises its K
weights to sum to 1, so a preset draws softmax-topk renormalised weights). The numbers come from
each model's own config.json (docs/models.md cites them); explicit flags override a preset's.

Expert parallelism (`expert_parallel_map`): rank R of N holds a contiguous slice of the routed
experts, the first E mod N ranks one more (vLLM's linear placement), and every shared expert,
which every token uses on every rank. The map makes a production shape fit a small machine: the
problem holds the local experts' weights only (config.problem_bytes).

Owns the table and the placement. Must not import torch, Triton or the CLI: the CLI and the fuzz's
bounds read it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelShape:
    """One model's MoE layer, as its published config gives it (routed experts, not counting shared ones)."""

    name: str
    hidden: int  # H: hidden_size
    inter: int  # I: moe_intermediate_size (per expert)
    experts: int  # routed experts: n_routed_experts / num_experts / num_local_experts
    topk: int  # routed experts per token: num_experts_per_tok / experts_per_token
    shared_experts: int = 0  # n_shared_experts (each of width I)
    routed_scaling_factor: float | None = None
    swiglu_limit: float | None = None
    quant: str = "bf16"  # the diffmoe scheme of the checkpoint engines serve
    source: str = ""  # the config.json the numbers were read from
    note: str = ""  # what diffmoe models differently from the model, if anything

    def fields(self) -> dict:
        """The MoEConfig fields this model sets."""
        return dict(num_experts=self.experts + self.shared_experts, topk=self.topk + self.shared_experts,
                    hidden=self.hidden, inter=self.inter, quant=self.quant, shared_experts=self.shared_experts,
                    routed_scaling_factor=self.routed_scaling_factor, swiglu_limit=self.swiglu_limit,
                    router="softmax-topk", renormalize=True)


_HF = "https://huggingface.co/{}/blob/main/config.json"

# Read from each model's config.json (the file at `source`). DeepSeek-V3 and Kimi K2 ship FP8 weights
# in 128x128 blocks (their configs' quantization_config, weight_block_size [128, 128]); the others'
# base checkpoints are bf16 (gpt-oss ships MXFP4 experts, which diffmoe does not judge yet: bf16 is the
# nearest scheme it judges, and H = 2880 is no multiple of 128, so no block scheme fits).
MODELS: dict[str, ModelShape] = {m.name: m for m in (
    ModelShape("deepseek-v3", hidden=7168, inter=2048, experts=256, topk=8, shared_experts=1, routed_scaling_factor=2.5,
               quant="fp8-block", source=_HF.format("deepseek-ai/DeepSeek-V3"),
               note="sigmoid scores with group-limited routing in the model; diffmoe's router weights are an input"),
    ModelShape("deepseek-r1", hidden=7168, inter=2048, experts=256, topk=8, shared_experts=1, routed_scaling_factor=2.5,
               quant="fp8-block", source=_HF.format("deepseek-ai/DeepSeek-R1"), note="DeepSeek-V3's architecture"),
    ModelShape("kimi-k2", hidden=7168, inter=2048, experts=384, topk=8, shared_experts=1, routed_scaling_factor=2.827,
               quant="fp8-block", source=_HF.format("moonshotai/Kimi-K2-Instruct"), note="DeepSeek-V3's architecture"),
    ModelShape("qwen3-30b-a3b", hidden=2048, inter=768, experts=128, topk=8,
               source=_HF.format("Qwen/Qwen3-30B-A3B")),
    ModelShape("qwen3-235b-a22b", hidden=4096, inter=1536, experts=128, topk=8,
               source=_HF.format("Qwen/Qwen3-235B-A22B")),
    ModelShape("qwen3-next-80b-a3b", hidden=2048, inter=512, experts=512, topk=10, shared_experts=1,
               source=_HF.format("Qwen/Qwen3-Next-80B-A3B-Instruct"),
               note="the model gates its shared expert by a sigmoid; diffmoe weights it 1"),
    ModelShape("gpt-oss-120b", hidden=2880, inter=2880, experts=128, topk=4, swiglu_limit=7.0,
               source=_HF.format("openai/gpt-oss-120b"),
               note="MXFP4 experts in the checkpoint, judged as bf16; the model adds biases and an alpha to SwiGLU"),
    ModelShape("glm-4.5", hidden=5120, inter=1536, experts=160, topk=8, shared_experts=1, routed_scaling_factor=2.5,
               source=_HF.format("zai-org/GLM-4.5")),
    ModelShape("mixtral-8x22b", hidden=6144, inter=16384, experts=8, topk=2,
               source=_HF.format("mistralai/Mixtral-8x22B-v0.1")),
)}


def model(name: str, flag: str = "model") -> ModelShape:
    """The preset called `name`; ValueError naming the flag and every preset otherwise."""
    if not isinstance(name, str):
        raise TypeError(f"{flag} must be a model name, one of {list(MODELS)}, got {name!r}")
    found = MODELS.get(name.strip().lower())
    if found is None:
        raise ValueError(f"{flag} must be one of {', '.join(MODELS)}, got {name.strip()[:60]!r}")
    return found


def parse_ep(text: str, flag: str = "--ep") -> tuple[int, int]:
    """`R/N`: rank R of an expert-parallel group of N ranks (0 <= R < N); ValueError naming the flag."""
    rank_text, sep, size_text = text.strip().partition("/")
    try:
        rank, size = int(rank_text), int(size_text)
    except ValueError:
        raise ValueError(f"{flag} must be RANK/SIZE with 0 <= RANK < SIZE (e.g. 0/32), got {text.strip()[:60]!r}") from None
    if not sep or size < 1 or not 0 <= rank < size:
        raise ValueError(f"{flag} must be RANK/SIZE with 0 <= RANK < SIZE (e.g. 0/32), got {text.strip()[:60]!r}")
    return rank, size


def expert_parallel_map(num_experts: int, shared_experts: int, rank: int, size: int) -> tuple[int, ...]:
    """The global -> local expert map of rank `rank` of `size`: its contiguous slice of the E - S routed
    experts (E // N each, one more on the first E mod N ranks), then the S shared experts, numbered
    0..L-1 in global order, -1 elsewhere. ValueError when a rank would hold no routed expert."""
    routed = num_experts - shared_experts
    if not 1 <= size <= routed:
        raise ValueError(f"ep size must be in [1, {routed}] (the routed experts: each rank holds at least one), got {size}")
    if not 0 <= rank < size:
        raise ValueError(f"ep rank must be in [0, {size - 1}], got {rank}")
    base, extra = divmod(routed, size)
    first = rank * base + min(rank, extra)
    count = base + (1 if rank < extra else 0)
    local = [*range(first, first + count), *range(routed, num_experts)]
    mapping = [-1] * num_experts
    for index, expert in enumerate(local):
        mapping[expert] = index
    return tuple(mapping)


# Maps longer than this are named by their placement where they have one (`--ep 0/64`, `ep=0/64`); shorter
# ones, every map the fuzz's domain draws (E <= 64), keep their entries, as replay lines always showed them.
PLACEMENT_NAMED_ABOVE = 64


def ep_placement(expert_map: tuple[int, ...] | None, shared_experts: int = 0) -> tuple[int, int] | None:
    """(rank, size) whose expert_parallel_map is exactly `expert_map` (the smallest such size), or None
    (always for maps of at most PLACEMENT_NAMED_ABOVE entries): a replay line then says `--ep RANK/SIZE`
    instead of hundreds of map entries."""
    if expert_map is None or len(expert_map) <= PLACEMENT_NAMED_ABOVE:
        return None
    num_experts = len(expert_map)
    routed = num_experts - shared_experts
    local = [g for g in range(routed) if expert_map[g] != -1]
    if routed < 1 or not local:
        return None
    first, count = local[0], len(local)
    for size in range(1, routed + 1):
        base, extra = divmod(routed, size)
        if count == base + 1 and first % (base + 1) == 0 and first // (base + 1) < extra:
            rank = first // (base + 1)
        elif count == base and base > 0 and (first - extra) % base == 0 and (first - extra) // base >= extra:
            rank = (first - extra) // base
        else:
            continue
        if rank < size and expert_parallel_map(num_experts, shared_experts, rank, size) == tuple(expert_map):
            return rank, size
    return None
