"""The wire format between the judge and the candidate's process (diffmoe/isolation/codec.py,
issue 43): data round-trips; a pickle, an unknown class, a field of the wrong type or a tensor
whose bytes do not match its shape is a MessageError, never code run."""

from __future__ import annotations

import json
import pickle
import struct

import pytest
import torch

from diffmoe.contract import Schedule
from diffmoe.findings import ByteRange, Finding
from diffmoe.isolation.codec import MessageError, decode, encode
from diffmoe.problem.config import MoEConfig
from diffmoe.problem.inputs import make_problem


def _frame(document) -> bytes:
    data = json.dumps(document).encode()
    return struct.pack("<Q", len(data)) + data


def test_what_a_check_sends_round_trips_bit_for_bit():
    config = MoEConfig(num_tokens=4, num_experts=2, topk=2, hidden=128, inter=128, quant="fp8-token", fused=False)
    problem = make_problem(config, torch.device("cpu"))
    fp8 = torch.randn(3, 5).to(torch.float8_e4m3fn)
    finding = Finding("contract", "m", "stage", ["b"], [ByteRange("ws1", 0, 8)], {"x": float("nan"), "t": (2, 3)})
    value = ("result", {"a": fp8, 7: {1, 2}}, [Schedule.parse("random:3"), problem, finding, b"\x00\xff"])
    back = decode(encode(value))
    assert back[1]["a"].dtype == torch.float8_e4m3fn and torch.equal(back[1]["a"].view(torch.uint8), fp8.view(torch.uint8))
    assert back[1][7] == {1, 2} and back[2][0] == Schedule.parse("random:3") and back[2][3] == b"\x00\xff"
    assert back[2][1].config == config and torch.equal(back[2][1].hidden_states, problem.hidden_states)
    assert back[2][2].byte_ranges == finding.byte_ranges and back[2][2].figures["t"] == (2, 3)


class _Payload:
    def __reduce__(self):
        return exec, ("raise SystemExit('ran in the judge')",)


def test_a_pickle_is_not_a_message_and_runs_nothing():
    with pytest.raises(MessageError):
        decode(pickle.dumps(("result", _Payload(), [])))
    with pytest.raises(TypeError, match="not data"):
        encode(("result", _Payload(), []))


@pytest.mark.parametrize("document, why", [
    ({"class": "Popen", "fields": {}}, "not a type"),
    ({"class": "Finding", "fields": {"oracle": 3, "message": "m"}}, "Finding.oracle"),
    ({"class": "Finding", "fields": {"oracle": "o", "message": "m", "__class__": "x"}}, "no field"),
    ({"T": 0, "dtype": "float32", "shape": [2], "device": "cpu"}, "buffer 0"),
    ({"dtype": "__import__"}, "not a torch dtype"),
    ({"device": "cuda; rm"}, "device"),
    ({"dict": [[[1], 2]]}, "as a key"),
])
def test_what_is_not_data_of_the_schema_is_refused(document, why):
    with pytest.raises(MessageError, match=why):
        decode(_frame(document))


def test_a_tensor_whose_bytes_do_not_match_its_shape_is_refused():
    data = encode(torch.zeros(4))
    with pytest.raises(MessageError, match="in 8 bytes|runs past"):
        decode(data[:-8])
