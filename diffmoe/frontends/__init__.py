"""The ways in: the `diffmoe` command line (`cli`, its top; `commands/`, one module per subcommand;
the shared options, exit codes and loading beside them; `plan_view` for `diffmoe plan`) and the
pytest plugin (`pytest_plugin`, entry point `diffmoe`).

Owns argument parsing, exit codes and presentation. Must not hold a check's logic: every
command calls into the judge, the fuzz, the backend, the adapters or a feature folder.
"""
