"""The oracles: one module per oracle behind one interface (base.py), listed in one table
(registry.py), plus the building blocks they share: guards.py (poison, red zones) and
diffmoe/interpreter/address_recorder.py (the interpreter's per-program address recorder).

Nothing is imported here, so reading the registry's names (the CLI's `--oracles`) costs no
torch import.

Must not import: the registry loads oracles on demand.
"""
