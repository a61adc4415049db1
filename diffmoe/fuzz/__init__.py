"""Fuzzing: Hypothesis draws configs, a check judges each one.

`strategies` (the bounded domains of `MoEConfig` and `Schedule`), `driver.fuzz` (the property
and its shrink), `tiers` (which oracles judge each example), `database` (interrupted shrinks
resume), `database_spec` (a folder or a redis:// URL), `workers` (N searches as Ray tasks, one
database), `plan_tier` (a static fuzz of declared workspace
plans), `profiles` (the Hypothesis settings profiles) and `campaign` (the false-alarm campaign).

Owns drawing and searching. Must not judge a config itself: every example goes through
diffmoe.judge.runner.
"""
