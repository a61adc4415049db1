"""The two-workspace planner (DESIGN.md, "The bug this project exists to catch").

Rule: walk the declared buffer list in reverse; even positions go to ws1, odd ones to ws2;
each workspace is as large as the largest buffer given to it; every buffer is a view at
offset 0 of its workspace. This is only safe when buffers that are live at the same time
land in different workspaces, i.e. when consecutive *materialised* buffers alternate.

* `fixed`: the declared list without `activation_output` when the fused flag is on (that
  buffer is never written, and keeping its slot flips the parity of everything before it).
* `legacy`: the declared list as is. With fused FP8 it puts `gate_up_output` and
  `quanted_down_input` in the same workspace at offset 0, while the fused act+quant kernel
  reads one and writes the other. Kept on purpose, so diffmoe can prove it catches it.

Owns the placement of every buffer in ws1/ws2. Must not allocate: the planner only declares.
"""

from __future__ import annotations

from diffmoe.problem.config import MoEConfig
from diffmoe.contract import Placement, WorkspacePlan
from diffmoe.problem.vocabulary import Buffers, buffer_spec, declared_workspace_buffers, pipeline_stages

NUM_WORKSPACES = 2


def planned_buffer_list(config: MoEConfig, planner: str | None = None) -> list[str]:
    """The list the planner colours, pipeline order."""
    planner = planner or config.planner
    names = declared_workspace_buffers(config)
    if planner == "fixed" and config.fused:
        names.remove(Buffers.ACTIVATION_OUTPUT)  # never materialised: must not take a slot
    elif planner not in ("fixed", "legacy"):
        raise ValueError(f"planner must be one of ['fixed', 'legacy'], got {planner!r}")
    return names


def plan_workspaces(config: MoEConfig, num_tokens: int, planner: str | None = None) -> WorkspacePlan:
    """Colour the buffer list for `num_tokens` tokens into ws1/ws2, every view at offset 0."""
    planner = planner or config.planner
    names = planned_buffer_list(config, planner)
    placements = []
    sizes = [0] * NUM_WORKSPACES
    for position, name in enumerate(reversed(names)):
        workspace = position % NUM_WORKSPACES  # even -> ws1 (0), odd -> ws2 (1)
        nbytes = buffer_spec(config, name, num_tokens).nbytes
        placements.append(Placement(name, workspace, 0, nbytes))
        sizes[workspace] = max(sizes[workspace], nbytes)
    placements.reverse()  # report in pipeline order
    return WorkspacePlan(
        planner=planner,
        buffer_list=tuple(names),
        placements=tuple(placements),
        stages=tuple(pipeline_stages(config)),
        workspace_bytes=(sizes[0], sizes[1]),
    )
