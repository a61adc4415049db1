"""How long a test waits on a process it started before calling it hung: a hang bound, never a
speed goal (tests/house/test_no_timed_asserts.py). 240 to 300 s was too close: beside a second full
suite (load 7 to 10, 2026-12-06) a two-worker local-cluster fuzz took over 280 s. It stays under
pytest-timeout's 900 s (pyproject.toml), so a hung child is named by the test that started it.

Owns the bound only.
"""

SUBPROCESS_HANG_S = 840
# A test that alone takes minutes: the museum's shrinker test took 251 s in a full suite (2026-12-07,
# 2 cores), about a third of what it takes beside a second full suite at load 13, so pytest-timeout's
# 900 s would end it there while it still works. It gets twice the bound, still a hang bound.
LONG_TEST_S = 1800
# The bound on a process such a test starts. The local-cluster fuzz of tests/cluster/test_cluster_fuzz.py
# shrinks to its end since a shrink stops by its runs, not the clock (diffmoe/fuzz/shrink_limits.py):
# 609 s for 10 examples and 40 shrinking runs beside a second full suite at load 9 (2026-12-07),
# past SUBPROCESS_HANG_S at load 13.
LONG_SUBPROCESS_S = LONG_TEST_S - 60
