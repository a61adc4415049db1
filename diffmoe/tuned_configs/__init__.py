"""`diffmoe tuned-configs`: every tuned tile config a peer's release ships, forced through the
release's own override mechanism on a CPU-size problem and judged by the oracles (issue 29).

files.py reads the release's config files (which scheme each one's name says, its entries);
sweep.py judges the entries (the shrunk problem, one check per distinct forced run, the resume
file); command.py is the command line (table, --json, progress, exit codes).

Owns nothing itself. Must not import an implementation: a release's configs and its override are
reached through the factory's attributes (sweep.factory_tuned_configs).
"""
