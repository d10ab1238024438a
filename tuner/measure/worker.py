"""A child process that runs one job at a time, with a timeout. If a job crashes
the process or overruns, the process is killed and a fresh one starts for the
next job; the tuning process never dies with it.

Children are fresh interpreters (`python -m tuner.measure.worker`), not forks: a
process that has used numba's threading layer and then forks gets children that
abort (FACTS.md), and unlike multiprocessing's spawn this never re-imports the
user's __main__. Messages are length-prefixed pickles over stdin/stdout.
"""
from __future__ import annotations

import os
import pickle
import select
import struct
import subprocess
import sys
import traceback

_HEADER = struct.Struct("<Q")


class WorkerDied(Exception):
    pass


class WorkerTimeout(Exception):
    pass


def _send(f, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    f.write(_HEADER.pack(len(data)) + data)
    f.flush()


def _read_exact(fd: int, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            raise EOFError("worker closed its pipe")
        buf += chunk
    return bytes(buf)


def _recv(fd: int):
    (n,) = _HEADER.unpack(_read_exact(fd, _HEADER.size))
    return pickle.loads(_read_exact(fd, n))


class Worker:
    def __init__(self, env: dict | None = None):
        self.env = dict(env or {})
        self.proc: subprocess.Popen | None = None

    def _ensure(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            env = {**os.environ, **self.env}
            from ir.custom import loaded_plugins  # the child imports the plugins this process loaded
            self.proc = subprocess.Popen([sys.executable, "-m", "tuner.measure.worker", *loaded_plugins()],
                                         stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)

    def call(self, fn, payload, timeout: float):
        """fn(payload) in the child -> ("ok", value) or ("error", message, traceback).
        Raises WorkerTimeout or WorkerDied (the child is then killed and replaced on the next call)."""
        self._ensure()
        fd = self.proc.stdout.fileno()
        try:
            _send(self.proc.stdin, (fn, payload))
            ready, _, _ = select.select([fd], [], [], timeout)
            if not ready:
                self.kill()
                raise WorkerTimeout(f"no answer within {timeout:.0f} s")
            return _recv(fd)
        except (EOFError, BrokenPipeError, OSError) as e:
            code = self.proc.poll() if self.proc else None
            self.kill()
            raise WorkerDied(f"worker process died (exit code {code}): {type(e).__name__}") from None

    def kill(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait(5)
            for f in (self.proc.stdin, self.proc.stdout):
                try:
                    f.close()
                except OSError:
                    pass
        self.proc = None

    close = kill

    def __del__(self):
        try:
            self.kill()
        except Exception:
            pass


def _serve(plugins: list[str]) -> None:
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # stray prints of a job must not corrupt the message stream
    broken = None
    try:
        from ir.custom import load_plugins
        load_plugins(plugins)  # custom ops and templates, before any job names them
    except Exception as e:  # every job then reports it, the worker stays up
        broken = f"plugins {plugins} failed to load in the worker: {type(e).__name__}: {e}"
    while True:
        try:
            fn, payload = _recv(inp.fileno())
        except EOFError:
            return
        try:
            if broken:
                raise RuntimeError(broken)
            reply = ("ok", fn(payload))
        except BaseException as e:  # report, never die of a job's exception
            reply = ("error", f"{type(e).__name__}: {e}", traceback.format_exc(limit=4))
        _send(out, reply)


if __name__ == "__main__":
    _serve(sys.argv[1:])
