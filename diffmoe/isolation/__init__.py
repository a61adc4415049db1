"""Isolation (issue 33): the candidate runs in a process that holds neither the reference, its
results, nor the judge.

    import_guard.py  the import hook of the candidate's process: the reference and the judge's
                     modules are refused, and every attempt is kept for a `contract` finding
    sandbox.py       the candidate's process: a clean "zygote" (torch, Triton, the candidate's
                     side of a check, the implementation's module) that forks one child per
                     check; the child serves diffmoe.check.candidate.Candidate's methods
    zygote.py        the judge's side of the zygote: its start (a fork of a judge that holds
                     no reference yet, else a fresh interpreter), reuse and stop
    client.py        the judge's side of a check: `RemoteCandidate`, which Check uses in
                     place of a Candidate, and `RemoteFactory`

    boundary.py      the OS boundary the zygote starts in (bubblewrap), and the audit hook that
                     refuses the candidate's writes and sockets
    codec.py         the wire format: data (JSON and raw tensor bytes), never pickles
    integrity.py     the judge's modules imported and its sources hashed before a candidate runs

Problems go in as data (never shared memory), runs come out as data; the judge compares them in
its own process. See docs/robustness.md ("Isolation").

Owns nothing itself; must not import the reference anywhere below (import_guard.py).
"""
