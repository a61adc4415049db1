"""A worked plug-in: a plain-PyTorch MoE (bf16, fp8-tensor and fp8-token, fused or not, either
output) whose every pipeline buffer, scales included, is a view carved from ws1/ws2 as `plan`
declares, one reported launch per stage. `diffmoe check --impl examples/torch_moe.py:make`."""

import torch
import torch.nn.functional as F

from diffmoe import ChainedRecorder
from diffmoe.contract import FP8_DTYPE, FP8_MAX, SCALES_OF, Buffers as N, LaunchInfo, Placement, RunResult, Stages as S, \
    WorkspacePlan, buffer_spec, materialised_buffers, pipeline_stages


def plan(config, num_tokens):  # consecutive buffers alternate ws1/ws2 at offset 0; scales follow their codes
    names = [n for n in materialised_buffers(config) if n != N.OUTPUT or config.output == "workspace"]
    placements, ends, ws = [], [0, 0], 1
    for name in names:
        ws, offset = (ws, -(-placements[-1].end // 16) * 16) if name in SCALES_OF.values() else (1 - ws, 0)
        placements.append(Placement(name, ws, offset, buffer_spec(config, name, num_tokens).nbytes))
        ends[ws] = max(ends[ws], placements[-1].end)
    return WorkspacePlan("torch-alternating", tuple(names), tuple(placements), tuple(pipeline_stages(config)), tuple(ends))


def quantize(x, quant):  # [R, C] -> (fp8 codes, fp32 scales), rounded where reference/moe.py rounds
    xf = x.float()  # per token, or per tensor (the amax of no element is 0): max(amax / 448, 1 / (448 * 512))
    amax = xf.abs().amax(dim=1, keepdim=True) if quant == "fp8-token" else (xf.abs().amax() if xf.numel() else xf.new_zeros(())).reshape(1)
    s = (amax / FP8_MAX).clamp_min(1.0 / (FP8_MAX * 512.0))
    return (xf / s).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE), s


def grouped_gemm(a, w, w_scale, local):  # out[r] = a[r] @ dequant(w[local[r]]).T in float32; expert -1: 0
    out = torch.zeros(a.shape[0], w.shape[1], dtype=torch.float32, device=a.device)
    for e in range(w.shape[0]):  # weight scales: per expert (L,) or per output channel (L, N)
        s = None if w_scale is None else (w_scale[e][:, None] if w_scale[e].dim() else w_scale[e])
        rows = (local == e).nonzero().flatten()
        out[rows] = a[rows] @ (w[e].float() if s is None else w[e].float() * s).T
    return out


def swiglu(gu, inter, limit):  # silu(gate) * up in float32, rounded once; the limit clamps both first
    gate, up = gu[:, :inter].float(), gu[:, inter:].float()
    if limit is not None:  # gate <= limit, up in [-limit, limit] (config.swiglu_limit; None: no clamp)
        gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
    return (F.silu(gate) * up).bfloat16()


def stage_math(stage, got, problem):
    """One stage on tensors named by the vocabulary -> its outputs, as fresh tensors (run_stage)."""
    cfg, (t, k), q = problem.config, problem.topk_ids.shape, problem.config.quant
    ids = problem.topk_ids.long().flatten()  # routed row t*K + k -> its local expert
    local = ids if problem.expert_map is None else problem.expert_map.long()[ids]
    act = lambda gu: swiglu(gu, cfg.inter, cfg.swiglu_limit)  # noqa: E731
    x = got[N.HIDDEN_STATES]  # router_weight='input' (K == 1) weighs the tokens first
    x = (x.float() * got[N.TOPK_WEIGHTS]).to(torch.bfloat16) if cfg.router_weight == "input" else x
    if stage == S.QUANT_INPUT:
        return dict(zip((N.QUANTED_GATE_UP_INPUT, N.QUANTED_GATE_UP_INPUT_SCALES), quantize(x, q)))
    if stage == S.GATE_UP_GEMM:
        a = got[N.QUANTED_GATE_UP_INPUT].float() * got[N.QUANTED_GATE_UP_INPUT_SCALES] if cfg.is_fp8 else x.float()
        return {N.GATE_UP_OUTPUT: grouped_gemm(a.repeat_interleave(k, 0), problem.w1, problem.w1_scale, local).bfloat16()}
    if stage == S.ACTIVATION:
        return {N.ACTIVATION_OUTPUT: act(got[N.GATE_UP_OUTPUT])}
    if stage in (S.QUANT_DOWN_INPUT, S.ACT_QUANT):  # fused or not: the same bf16 activation first
        a = got[N.ACTIVATION_OUTPUT] if stage == S.QUANT_DOWN_INPUT else act(got[N.GATE_UP_OUTPUT])
        return dict(zip((N.QUANTED_DOWN_INPUT, N.QUANTED_DOWN_INPUT_SCALES), quantize(a, q)))
    if stage == S.DOWN_GEMM:
        a = got[N.QUANTED_DOWN_INPUT].float() * got[N.QUANTED_DOWN_INPUT_SCALES] if cfg.is_fp8 else got[N.ACTIVATION_OUTPUT].float()
        down = grouped_gemm(a, problem.w2, problem.w2_scale, local)  # router weight in float32, then bf16
        return {N.DOWN_OUTPUT: (down * got[N.TOPK_WEIGHTS].reshape(-1, 1) if cfg.router_weight == "down" else down).bfloat16()}
    rows = got[N.DOWN_OUTPUT].view(t, k, cfg.hidden).float().unbind(1)  # the reduce: float32, k = 0..K-1
    total = sum(rows[1:], rows[0])  # DeepSeek-style models scale the routed sum, in float32, before rounding
    return {N.OUTPUT: (total if cfg.routed_scaling_factor is None else total * cfg.routed_scaling_factor).bfloat16()}


class TorchMoE:
    def __init__(self, config):  # config.num_tokens: the largest call
        if config.quant == "fp8-block":
            raise ValueError("quant must be bf16, fp8-tensor or fp8-token for this example, got 'fp8-block'")
        self.config = config.validate()

    def workspace_plan(self, num_tokens):
        return plan(self.config, num_tokens)

    def workspace_shapes(self, max_tokens):
        return plan(self.config, max_tokens).workspace_bytes

    def run(self, problem, workspaces, *, output=None, schedule=None, recorder=None):
        cfg, t, recorder = self.config, problem.num_tokens, ChainedRecorder(recorder)  # forwards to the harness's
        views = dict(problem.inputs())
        for p in plan(cfg, t).placements:  # carve bytes [offset, end) of ws1/ws2, as declared
            spec = buffer_spec(cfg, p.buffer, t)
            views[p.buffer] = workspaces[p.workspace][p.offset : p.end].view(spec.dtype).view(spec.shape)
        views.setdefault(N.OUTPUT, output if output is not None else torch.empty(t, cfg.hidden, dtype=torch.bfloat16))
        for stage in pipeline_stages(cfg):  # one launch per stage, the views it reads and writes named
            info = LaunchInfo(stage.name, f"torch_{stage.name}", (1,), {n: views[n] for n in stage.reads},
                              {n: views[n] for n in stage.writes})
            recorder.before_launch(info)
            for name, value in self.run_stage(stage.name, dict(info.reads), problem).items():
                views[name].copy_(value)
            recorder.after_launch(info)
        return RunResult(output=views[N.OUTPUT])

    def run_stage(self, stage, inputs, problem, *, schedule=None, recorder=None):
        return stage_math(stage, {**problem.inputs(), **inputs}, problem)


def make(config):  # the factory: `--impl examples/torch_moe.py:make`
    return TorchMoE(config)


make.plan_workspaces = plan  # `diffmoe plan` asks this instead of building
make.batch_invariant = False  # torch's CPU matmul blocks by row count: a token's bits may follow its batch
