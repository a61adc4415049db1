"""Fitting a numerics profile to an implementation (`diffmoe numerics fit`, issue 27): the calibration
set (calibration.py), the per-stage search of each point's menu on the candidate's own inputs
(search.py), the join into one profile or residues (solve.py), the API and its report (fit.py).

Owns nothing itself. Must not import an implementation (the factory is handed in).
"""

from diffmoe.numerics_fit.fit import FitReport, fit_profile

__all__ = ["FitReport", "fit_profile"]
