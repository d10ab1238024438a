"""tensortune: the one command name nobody else installs.

`tensortune tune|db|run|batch|inspect|doctor ...` (or `python -m tensortune ...`) runs the
same CLIs as `tune`, `tune-db`, `tune-run` and `tune-batch`, and keeps working when another
package (Ray's wheel does) installs a `tune` of its own over ours."""

__version__ = "0.1.0"   # tests/test_commands.py keeps it equal to pyproject.toml's
