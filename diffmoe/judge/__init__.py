"""The judge: one check orchestrated, above the oracles it runs.

`runner.py` (`run_differential`: the config refused or resolved, the candidate started behind
its boundary, the reference and every selected oracle run, the report) and `differential_run.py`
(one check's runs in order: the schedules, the oracles' hooks, the findings collected).

Owns the order of a check. Must not define an oracle (diffmoe/oracles/) or a run's machinery
(diffmoe/check/): it calls them.
"""
