"""A pytest suite for your own MoE, with diffmoe's pytest plugin (loaded with the package).

Run: `python -m pytest examples/test_my_moe.py -q` (with CI=true the plugin loads the
derandomized `ci` Hypothesis profile; `--hypothesis-profile thorough` searches harder).

The plugin's fixtures are session-scoped, so they work inside an @given test (Hypothesis refuses
function-scoped fixtures there: FailedHealthCheck). Or skip the fixture and call the plugin's
`report_failure_message` yourself (`test_fixed_configs`).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings

from diffmoe import MoEConfig, load_factory, run_differential
from diffmoe.pytest_plugin import report_failure_message
from diffmoe.strategies import moe_configs

# your factory, as --impl names it: "mypackage.mymoe:make" works the same way
SPEC = f"{Path(__file__).with_name('torch_moe.py')}:make"
make = load_factory(SPEC)


@settings(max_examples=3)
@given(config=moe_configs(max_tokens=8, max_experts=4, quant=["bf16", "fp8-tensor", "fp8-token"]))  # what the example implements
def test_every_oracle_passes(config, assert_report_passes):
    assert_report_passes(run_differential(config, make, implementation_name=SPEC))


@pytest.mark.parametrize("quant", ["bf16", "fp8-tensor", "fp8-token"])
def test_fixed_configs(quant):
    config = MoEConfig(num_tokens=4, num_experts=2, topk=2, hidden=128, inter=128, quant=quant, fused=quant != "bf16")
    report = run_differential(config, make, implementation_name=SPEC)
    assert report.passed, report_failure_message(report)
