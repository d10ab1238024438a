"""`tensortune doctor`: are the commands the shell finds tensortune's?

Ray's wheel installs a console script `tune` (Ray Tune's CLI); installed after tensortune it
replaces ours, and `tune --model ...` fails inside Ray. Our `tune` cannot notice (it no longer
runs), so this reads the scripts on PATH instead: a console-script wrapper names the module
it imports its entry point from, which tells whose it is. Nothing here imports Ray or the
tuner, so the check costs a file read per command."""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from importlib import metadata
from urllib.parse import unquote, urlparse

# our console scripts -> (the module their wrapper imports, the `tensortune` subcommand)
OURS = {
    "tune": ("tuner.cli", "tune"),
    "tune-db": ("database.cli", "db"),
    "tune-run": ("runtime.cli", "run"),
    "tune-batch": ("tuner.batch", "batch"),
}
_HEAD = 4096   # a wrapper is a few hundred bytes
_IMPORT = re.compile(r"^from\s+(?!__future__\b)([A-Za-z_][\w.]*)\s+import\s+\w+", re.M)
_LOAD_ENTRY_POINT = re.compile(r"load_entry_point\(\s*['\"]([A-Za-z0-9_.\-]+)")   # old setuptools wrappers
_PYENV_SHIM = re.compile(r'exec\s+"([^"]*pyenv)"\s+exec\s+"\$program"')
_PYENV_ROOT = re.compile(r'export\s+PYENV_ROOT="([^"]*)"')


@dataclass(frozen=True)
class Script:
    """What a console script on disk runs, read from its text."""
    path: str
    interpreter: str | None   # its #! line
    module: str | None        # the module a pip/uv wrapper imports its entry point from
    dist: str | None          # the distribution an old setuptools wrapper names


@dataclass(frozen=True)
class Finding:
    command: str
    level: str   # "ok", "note" (works, but worth knowing) or "problem" (does not run tensortune)
    text: str


def _head(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read(_HEAD).decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def read_script(path: str) -> Script:
    text = _head(path) or ""   # a binary launcher reads as no text: whose it is stays unknown
    first = text.splitlines()[0] if text else ""
    named = _LOAD_ENTRY_POINT.search(text)
    imported = None if named else _IMPORT.search(text)   # an old wrapper imports pkg_resources, not the entry
    return Script(path, first[2:].strip() if first.startswith("#!") else None,
                  imported.group(1) if imported else None, named.group(1) if named else None)


def _through_pyenv_shim(found: str, command: str) -> str | None:
    """A pyenv shim runs the command of the active Python version: ask pyenv which file
    that is (None: the active version has none, so the shim fails too)."""
    text = _head(found) or ""
    shim = _PYENV_SHIM.search(text)
    if shim is None:
        return found
    env = dict(os.environ)
    root = _PYENV_ROOT.search(text)
    if root:
        env["PYENV_ROOT"] = root.group(1)
    try:
        r = subprocess.run([shim.group(1), "which", command], capture_output=True, text=True, timeout=10, env=env)
    except (OSError, subprocess.TimeoutExpired):
        return found
    lines = r.stdout.strip().splitlines()
    return lines[-1] if r.returncode == 0 and lines else None


def find_command(command: str, path: str | None = None) -> str | None:
    """The file the shell runs for `command` (through a pyenv shim), or None."""
    found = shutil.which(command, path=path)
    return _through_pyenv_shim(found, command) if found else None


def owner(command: str, script: Script) -> str:
    """The distribution that installed `script`: the one whose console script `command`
    imports the module the wrapper imports (read from installed metadata)."""
    if script.dist:
        return script.dist
    if script.module:
        for ep in metadata.entry_points(group="console_scripts", name=command):
            if ep.module == script.module and getattr(ep, "dist", None) is not None:
                return ep.dist.name
        return script.module.split(".")[0]
    return "another package"


def reinstall_command() -> str:
    """The pip command that writes tensortune's scripts again, for the install at hand
    (an editable install from a checkout is reinstalled from that checkout)."""
    target = "tensortune"
    try:
        direct = json.loads(metadata.distribution("tensortune").read_text("direct_url.json") or "null")
    except (metadata.PackageNotFoundError, ValueError):
        direct = None
    if isinstance(direct, dict) and str(direct.get("url", "")).startswith("file://"):
        where = shlex.quote(unquote(urlparse(direct["url"]).path))
        target = f"-e {where}" if (direct.get("dir_info") or {}).get("editable") else where
    return f"{shlex.quote(sys.executable)} -m pip install --force-reinstall --no-deps {target}"


def _declared() -> set[str]:
    """Console scripts the installed tensortune declares (empty: not installed)."""
    try:
        return {ep.name for ep in metadata.distribution("tensortune").entry_points if ep.group == "console_scripts"}
    except metadata.PackageNotFoundError:
        return set()


def _same_python(interpreter: str | None) -> bool:
    if not interpreter or " " in interpreter:   # `#!/usr/bin/env python3`: whichever the PATH gives
        return True
    here = os.path.realpath(os.path.dirname(sys.executable))
    return os.path.realpath(os.path.dirname(interpreter)) == here


def check(command: str, path: str | None = None) -> Finding:
    module, sub = OURS[command]
    instead = f"use 'tensortune {sub} ...' or 'python -m tensortune {sub} ...'"
    found = find_command(command, path)
    if found is None:
        if command not in _declared():
            return Finding(command, "problem", f"`{command}` is not installed: {instead}, or install the "
                                               f"scripts with '{reinstall_command()}'")
        scripts = sysconfig.get_path("scripts")
        return Finding(command, "problem", f"`{command}` is not on PATH (this Python installs it in {scripts}): "
                                           f"{instead}, or put {scripts} on PATH")
    script = read_script(found)
    if script.module == module or (script.module is None and script.dist == "tensortune"):
        if not _same_python(script.interpreter):
            return Finding(command, "note", f"`{command}` ({found}) is tensortune's but runs another Python "
                                            f"({script.interpreter}), not this one ({sys.executable})")
        return Finding(command, "ok", f"`{command}` ({found}) is tensortune's")
    if script.module is None and script.dist is None:
        return Finding(command, "note", f"`{command}` ({found}) is not a Python console script: cannot tell "
                                        f"whose it is; if it does not run tensortune, {instead}")
    what = f" ({script.module})" if script.module else ""
    return Finding(command, "problem", f"`{command}` ({found}) is {owner(command, script)}'s{what}, not "
                                       f"tensortune's: {instead}, or take `{command}` back with "
                                       f"'{reinstall_command()}'")


def shadow_note(path: str | None = None) -> str | None:
    """One line when `tune` on PATH belongs to another package (said by `tensortune --help`)."""
    found = find_command("tune", path)
    if found is None:
        return None
    script = read_script(found)
    if script.module is None or script.module == OURS["tune"][0]:
        return None
    return check("tune", path).text


def main(argv: list[str] | None = None) -> int:
    from ir.errors import CliParser
    p = CliParser(prog="tensortune doctor",
                  description="Check that the commands on PATH run tensortune; say how to fix the ones that do not "
                              "(Ray's wheel installs a `tune` of its own).")
    p.add_argument("commands", nargs="*", metavar="COMMAND", help=f"default: {' '.join(OURS)}")
    a = p.parse_args(argv)
    unknown = [c for c in a.commands if c not in OURS]
    if unknown:
        p.error(f"not a tensortune command: {', '.join(unknown)} (choose from {', '.join(OURS)})")
    findings = [check(c) for c in (a.commands or OURS)]
    for f in findings:
        print(f"{f.level}: {f.text}")
    return 1 if any(f.level == "problem" for f in findings) else 0
