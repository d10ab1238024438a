"""A child process that runs one job at a time, with a timeout. If a job crashes
the process or overruns, the process is killed and a fresh one starts for the
next job; the tuning process never dies with it.

Children are fresh interpreters (`python -m tuner.measure.worker`), not forks: a
process that has used numba's threading layer and then forks gets children that
abort (FACTS.md), and unlike multiprocessing's spawn this never re-imports the
user's __main__.

Messages are length-prefixed pickles over a pair of pipes of their own, not
stdin/stdout: a job (or the C code it calls) that writes to file descriptor 1
writes to the child's stderr and can never corrupt the message stream. A child
dies with its parent: PR_SET_PDEATHSIG on Linux (works even while a job holds the
GIL), and a watchdog thread that notices the parent is gone elsewhere. The child
ignores SIGINT: Ctrl-C is the tuning process's to handle, and it kills its workers.
"""
from __future__ import annotations

import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import threading
import time
import traceback

_HEADER = struct.Struct("<Q")
_MAX_MESSAGE = 1 << 30   # a longer "message" is a garbled stream, not something to allocate


class WorkerDied(Exception):
    pass


class WorkerTimeout(Exception):
    pass


def _send(fd: int, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(_HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


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
    if n > _MAX_MESSAGE:
        raise EOFError(f"garbled message header ({n} bytes announced)")
    return pickle.loads(_read_exact(fd, n))


class Worker:
    def __init__(self, env: dict | None = None):
        self.env = dict(env or {})
        self.proc: subprocess.Popen | None = None
        self._to_child = self._from_child = -1
        self._lock = threading.Lock()
        self._caller: int | None = None   # thread of the call in flight, if any
        self.last_exit: int | None = None  # exit status of the child that died last (-9: SIGKILLed)

    def _ensure(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            return
        self.kill()
        env = {**os.environ, **self.env}
        from ir.custom import loaded_plugins  # the child imports the plugins this process loaded
        req_r, req_w = os.pipe()      # not inheritable: other workers started meanwhile never hold our ends,
        rep_r, rep_w = os.pipe()      # so a dead child always reads as EOF here
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tuner.measure.worker", str(req_r), str(rep_w), str(os.getpid()), *loaded_plugins()],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                pass_fds=(req_r, rep_w), env=env)
        except BaseException:
            for fd in (req_w, rep_r):
                os.close(fd)
            raise
        finally:
            os.close(req_r)
            os.close(rep_w)
        self._to_child, self._from_child = req_w, rep_r

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def call(self, fn, payload, timeout: float):
        """fn(payload) in the child -> ("ok", value) or ("error", message, traceback).
        Raises WorkerTimeout or WorkerDied (the child is then killed and replaced on the next call)."""
        self._ensure()
        self._caller = threading.get_ident()
        try:
            _send(self._to_child, (fn, payload))
            ready, _, _ = select.select([self._from_child], [], [], timeout)
            if not ready:
                self.kill()
                raise WorkerTimeout(f"no answer within {timeout:.0f} s")
            return _recv(self._from_child)
        except (EOFError, OSError, pickle.UnpicklingError) as e:
            code = None
            if self.proc is not None:   # its pipe closes before it can be reaped: wait for its status
                try:
                    code = self.proc.wait(2.0)
                except subprocess.TimeoutExpired:
                    pass
            self.last_exit = code
            self.kill()
            raise WorkerDied(f"worker process died (exit code {code}): {type(e).__name__}: {e}") from None
        finally:
            self._caller = None

    def kill(self) -> None:
        """Kill the child. From another thread than a call in flight, only the process:
        that call then reads EOF and closes the pipes itself (never a descriptor in use)."""
        with self._lock:
            if self.proc is not None and self.proc.poll() is None:
                self.proc.kill()
            if self._caller not in (None, threading.get_ident()):
                return
            if self.proc is not None:
                try:
                    self.proc.wait(5)
                except subprocess.TimeoutExpired:
                    pass
            for fd in (self._to_child, self._from_child):
                if fd >= 0:
                    try:
                        os.close(fd)
                    except OSError:
                        pass
            self._to_child = self._from_child = -1
            self.proc = None

    close = kill

    def __del__(self):
        try:
            self.kill()
        except Exception:
            pass


def _die_with_parent(parent: int) -> None:
    """Exit when the tuning process is gone, even if it was SIGKILLed mid-job."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL, 0, 0, 0)   # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass

    def watch():
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    if os.getppid() != parent:   # the parent died before the death signal was armed
        os._exit(1)
    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


def _serve(req_fd: int, rep_fd: int, parent: int, plugins: list[str]) -> None:
    os.dup2(2, 1)              # C code writing to fd 1 goes where stderr goes, never into the channel
    sys.stdout = sys.stderr
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent(parent)
    broken = None
    try:
        from ir.custom import load_plugins
        load_plugins(plugins)  # custom ops and templates, before any job names them
    except Exception as e:  # every job then reports it, the worker stays up
        broken = f"plugins {plugins} failed to load in the worker: {type(e).__name__}: {e}"
    while True:
        try:
            fn, payload = _recv(req_fd)
        except EOFError:
            return
        try:
            if broken:
                raise RuntimeError(broken)
            reply = ("ok", fn(payload))
        except BaseException as e:  # report, never die of a job's exception
            reply = ("error", f"{type(e).__name__}: {e}", traceback.format_exc(limit=4))
        try:
            _send(rep_fd, reply)   # pickles before it writes: a reply that cannot pickle writes nothing
        except (pickle.PicklingError, TypeError, AttributeError) as e:
            _send(rep_fd, ("error", f"the job's reply cannot be sent back: {type(e).__name__}: {e}", ""))


if __name__ == "__main__":
    _serve(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:])
