"""`tensortune COMMAND ...`: one name for every tensortune CLI.

Another package may install a console script called `tune` over ours (Ray's wheel does:
Ray Tune's CLI); nothing installs `tensortune`, and `python -m tensortune` needs no script
at all. Each command's module is imported only when it runs, so `--help` stays instant."""
from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass

from ir.errors import TensortuneError, one_line   # cheap: ir loads its heavy parts lazily
from tensortune import __version__


class UnavailableCommand(TensortuneError):
    """The command's module is not part of this installation."""


@dataclass(frozen=True)
class Command:
    target: str                 # "module:function", called with the remaining arguments
    summary: str
    script: str | None = None   # the console script that does the same, if any
    prefix: tuple = ()          # arguments put before the user's


COMMANDS: dict[str, Command] = {
    "tune": Command("tuner.cli:main", "tune an ONNX model's kernels into the database", "tune"),
    "inspect": Command("tuner.cli:main", "print a model's partition (subgraphs, shapes, templates) without tuning",
                       "tune inspect", ("inspect",)),
    "db": Command("database.cli:main", "query, export, import and prune the tuning database", "tune-db"),
    "run": Command("runtime.cli:main", "run a model with its tuned kernels (--check, --bench)", "tune-run"),
    "batch": Command("tuner.batch:main", "tune many models as one batch job, locally or on Ray", "tune-batch"),
    "doctor": Command("tensortune.doctor:main", "check that `tune`, `tune-db`, ... on PATH are tensortune's"),
}


def load(name: str):
    """The function that runs command `name`. A missing module of the command itself is
    one clear error; a missing dependency inside it is left to tell its own name."""
    module, _, function = COMMANDS[name].target.partition(":")
    try:
        loaded = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name != module:
            raise
        raise UnavailableCommand(f"'tensortune {name}' is not available in this installation "
                            f"(module {module} is missing; reinstall tensortune)") from None
    return getattr(loaded, function)


def help_text() -> str:
    width = max(map(len, COMMANDS))
    rows = []
    for name, c in COMMANDS.items():
        same = f"  (= {c.script})" if c.script else ""
        rows.append(f"  {name:<{width}}  {c.summary}{same}")
    return "\n".join([
        "usage: tensortune COMMAND [ARGS...]      (the same: python -m tensortune COMMAND [ARGS...])",
        "",
        "Every tensortune CLI under a name no other package installs (Ray's wheel installs a `tune`).",
        "",
        "commands:",
        *rows,
        "",
        "`tensortune COMMAND --help` lists a command's options; -V/--version prints the version.",
    ])


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(help_text(), file=sys.stdout if argv else sys.stderr)
        from tensortune.doctor import shadow_note
        note = shadow_note()   # where a confused user looks first: say it here too
        if note:
            print(f"\nnote: {note}", file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        print(f"tensortune {__version__}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"tensortune: error: unknown command {name!r}; choose from {', '.join(COMMANDS)} "
              f"(see tensortune --help)", file=sys.stderr)
        return 2
    try:
        run = load(name)
    except UnavailableCommand as e:
        print(f"tensortune: error: {one_line(e)}", file=sys.stderr)
        return 2
    rc = run(list(COMMANDS[name].prefix) + rest)
    return 0 if rc is None else rc
