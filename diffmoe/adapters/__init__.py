"""The adapter kit: what an implementation provides, and the peers' own wheels.

`contract` (the plug-in contract: `MoEImplementation`, plans, launches, schedules), `peer_wheels`
(`diffmoe peers fetch`: the pinned wheels peers/ loads files from) and `museum` (released vLLM
wheels whose MoE bugs diffmoe catches).

Owns the boundary between diffmoe and any implementation. Must not import an implementation:
implementations are reached through a factory named at run time.
"""
