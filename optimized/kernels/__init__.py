"""Triton jit code only; the launchers that check, carve and launch live one level up.

Must not import launchers, torch buffers or the harness.
"""
