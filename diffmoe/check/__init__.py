"""One check: one problem, the reference, one implementation, the selected oracles, one Report.

`runner.run_differential` orchestrates; `execution.Check` builds instances and calls the
implementation (in a worker process, `worker`, under `call_environment`), `watchers` and
`recording` watch each launch, and `report` holds the findings and the replay command.

Owns running a check and reporting it. Must not judge: verdicts live in diffmoe/oracles/, and
how close is close enough in diffmoe/tolerance/.
"""
