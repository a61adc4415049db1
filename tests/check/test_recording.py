"""LaunchLog and ChainedRecorder: byte regions of views, launch order, snapshots."""

import torch

from diffmoe.contract import LaunchInfo
from diffmoe.check.recording import ChainedRecorder, LaunchLog, region_of


def test_region_of_a_contiguous_view_of_a_workspace():
    ws = torch.zeros(1024, dtype=torch.uint8)
    view = ws[100:200].view(torch.bfloat16).view(10, 5)  # [10, 5] bf16 = 100 bytes
    region = region_of("gate_up_output", view)
    assert (region.name, region.storage_ptr, region.start_byte, region.end_byte) == ("gate_up_output", ws.data_ptr(), 100, 200)
    assert region.device == "cpu" and region.storage_nbytes == 1024 and region.nbytes == 100


def test_region_of_a_strided_view_spans_from_first_to_last_addressed_byte():
    t = torch.zeros(4, 8, dtype=torch.float32)
    columns = t[:, 2:5]  # rows of 3 floats, 8 floats apart
    region = region_of("x", columns)
    assert (region.start_byte, region.end_byte) == (2 * 4, (3 * 8 + 4) * 4 + 4)
    transposed = region_of("x", t.t())
    assert (transposed.start_byte, transposed.end_byte) == (0, 4 * 8 * 4)


def test_region_of_an_empty_view_is_empty():
    t = torch.zeros(16, dtype=torch.float32)
    region = region_of("x", t[5:5])
    assert region.start_byte == region.end_byte == 20


def test_regions_overlap_only_on_the_same_storage():
    ws = torch.zeros(64, dtype=torch.uint8)
    other = torch.zeros(64, dtype=torch.uint8)
    a, b = region_of("a", ws[0:32]), region_of("b", ws[16:48])
    assert a.overlap(b) == (16, 32)
    assert a.overlap(region_of("c", ws[32:64])) is None
    assert a.overlap(region_of("d", other[0:32])) is None


def _launch(stage, reads=None, writes=None, grid=(1,)):
    return LaunchInfo(stage=stage, kernel=f"{stage}_kernel", grid=grid, reads=reads or {}, writes=writes or {})


def test_launch_log_records_every_launch_in_order():
    ws = torch.zeros(256, dtype=torch.uint8)
    log = LaunchLog()
    first = _launch("quant_input", writes={"quanted_gate_up_input": ws[0:64]}, grid=(4,))
    second = _launch("gate_up_gemm", reads={"quanted_gate_up_input": ws[0:64]}, writes={"gate_up_output": ws[64:192]}, grid=(2, 3))
    for launch in (first, second):
        log.before_launch(launch)
        log.after_launch(launch)
    assert len(log) == 2 and [(r.index, r.stage, r.kernel, r.grid) for r in log] == [
        (0, "quant_input", "quant_input_kernel", (4,)),
        (1, "gate_up_gemm", "gate_up_gemm_kernel", (2, 3)),
    ]
    assert [(w.name, w.start_byte, w.end_byte) for w in log.launches[1].writes] == [("gate_up_output", 64, 192)]
    assert [r.name for r in log.launches[1].reads] == ["quanted_gate_up_input"]
    assert log.snapshots == {}
    log.clear()
    assert len(log) == 0


def test_snapshots_keep_what_a_launch_wrote_before_a_later_launch_overwrites_it():
    ws = torch.zeros(16, dtype=torch.uint8)
    log = LaunchLog(snapshot=True)

    def run(stage, name, value):
        launch = _launch(stage, writes={name: ws[0:8]})
        log.before_launch(launch)
        ws[0:8] = value
        log.after_launch(launch)

    run("gate_up_gemm", "gate_up_output", 1)
    run("act_quant", "quanted_down_input", 2)  # same bytes, as in a shared workspace
    assert log.snapshots["gate_up_output"].tolist() == [1] * 8
    assert log.snapshots["quanted_down_input"].tolist() == [2] * 8
    run("act_quant", "quanted_down_input", 3)  # the latest write wins
    assert log.snapshots["quanted_down_input"].tolist() == [3] * 8
    assert log.snapshot_launch == {"gate_up_output": 0, "quanted_down_input": 2}
    assert log.snapshots["gate_up_output"].untyped_storage().data_ptr() != ws.data_ptr()


class _Events:
    def __init__(self, name, events):
        self.name, self.events = name, events

    def before_launch(self, launch):
        self.events.append((self.name, "before", launch.stage))

    def after_launch(self, launch):
        self.events.append((self.name, "after", launch.stage))


def test_chained_recorder_forwards_to_each_in_order():
    events = []
    chained = ChainedRecorder(_Events("a", events), None, _Events("b", events))
    launch = _launch("reduce")
    chained.before_launch(launch)
    chained.after_launch(launch)
    assert events == [("a", "before", "reduce"), ("b", "before", "reduce"), ("a", "after", "reduce"), ("b", "after", "reduce")]


def test_chained_recorder_feeds_a_launch_log():
    log = LaunchLog()
    chained = ChainedRecorder(log)
    chained.before_launch(_launch("align"))
    assert [r.stage for r in log] == ["align"]
