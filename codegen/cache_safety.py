"""The kernel cache holds code we run (generated modules) and pickles numba loads
(`.nbi` index, `.nbc` machine code): unpickling runs code. Two rules keep what
we load ours:

1. Every cache directory is private: owned by this user and not writable by
   group or others (we create them 0700), and no directory above the cache root
   lets anyone else swap it (owned by us or root, and group/other-writable only
   with the sticky bit, like /tmp). Anything else is a `CacheError`, before any
   file in it is read. This is the security boundary: whoever can write a
   directory can also write any checksum kept in it, and a keyed MAC would need
   a key stored outside the cache that the same user (the only other writer
   left) could read anyway.
2. numba reads only cache files whose sha256 matches the manifest we wrote
   right after numba produced them. This catches what the permissions cannot:
   a file truncated by a crash or a full disk (numba would raise
   "pickle data was truncated" on every later load), or files we never wrote.
   Such entries are deleted and the kernel is recompiled.
"""
from __future__ import annotations

import hashlib
import json
import os
import stat
import tempfile
from pathlib import Path

from ir.errors import TensortuneError

CACHE_SUFFIXES = (".nbi", ".nbc")
_SHARED_BITS = stat.S_IWGRP | stat.S_IWOTH


class CacheError(TensortuneError):
    """The kernel cache is not private to this user: nothing in it is loaded."""


def _refuse(path: Path, why: str, var: str) -> CacheError:
    return CacheError(f"kernel cache directory '{path}' {why}: another user could plant code there, so nothing "
                      f"in it is loaded (make it private: chmod 700, owned by you; or set {var} to a directory "
                      f"only you can write)")


def _check_owned_private(path: Path, var: str) -> None:
    link = os.lstat(path)
    if stat.S_ISLNK(link.st_mode) and link.st_uid not in (os.geteuid(), 0):
        raise _refuse(path, f"is a symlink owned by uid {link.st_uid}", var)
    st = os.stat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise CacheError(f"kernel cache path '{path}' is not a directory (set TENSORTUNE_CACHE to a directory)")
    if st.st_uid != os.geteuid():
        raise _refuse(path, f"is owned by uid {st.st_uid}, not by you (uid {os.geteuid()})", var)
    if st.st_mode & _SHARED_BITS:
        raise _refuse(path, f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})", var)


def _check_ancestors(path: Path, var: str) -> None:
    """No directory above `path` lets another user rename it away and put theirs in its place."""
    for parent in path.resolve().parents:
        st = os.stat(parent)
        if st.st_uid not in (os.geteuid(), 0):
            raise _refuse(parent, f"(above the cache) is owned by uid {st.st_uid}", var)
        if st.st_mode & _SHARED_BITS and not st.st_mode & stat.S_ISVTX:
            raise _refuse(parent, f"(above the cache) is writable by others without the sticky bit "
                                  f"(mode {stat.S_IMODE(st.st_mode):04o})", var)


def private_dir(path: Path, top: bool = False, var: str = "TENSORTUNE_CACHE") -> Path:
    """`path`, created 0700 (with any missing parents) if absent, checked private either way.
    `top`: `path` is the cache root, so the directories above it are checked too; `var` is
    the environment variable that chooses it (named in the error)."""
    path = Path(path)
    missing = []
    p = path
    while not os.path.lexists(p) and p != p.parent:
        missing.append(p)
        p = p.parent
    for p in reversed(missing):
        try:
            os.mkdir(p, 0o700)
        except FileExistsError:
            pass  # made by a concurrent process: checked below like any existing directory
        except OSError as e:
            raise CacheError(f"cannot create kernel cache directory '{p}': {e.strerror or e}") from None
    try:
        if top or missing:
            _check_ancestors(path, var)
        for p in [path] + [m for m in missing if m != path]:
            _check_owned_private(p, var)
    except OSError as e:
        raise CacheError(f"cannot check kernel cache directory '{path}': {e.strerror or e}") from None
    return path


def cache_files(ndir: Path, stem: str) -> list[Path]:
    """numba's index and data files of the module `stem` (not its temporaries)."""
    try:
        names = os.listdir(ndir)
    except FileNotFoundError:
        return []
    return sorted(ndir / n for n in names if n.startswith(stem + ".") and n.endswith(CACHE_SUFFIXES))


def _manifest(ndir: Path, stem: str) -> Path:
    return ndir / f"{stem}.sha256.json"


def _digests(files: list[Path]) -> dict[str, str] | None:
    out = {}
    for f in files:
        try:
            if not stat.S_ISREG(os.lstat(f).st_mode):
                return None
            out[f.name] = hashlib.sha256(f.read_bytes()).hexdigest()
        except OSError:
            return None
    return out


def discard(ndir: Path, stem: str) -> None:
    for f in cache_files(ndir, stem) + [_manifest(ndir, stem)]:
        try:
            f.unlink()
        except FileNotFoundError:
            pass


def verified(ndir: Path, stem: str) -> bool:
    """True when `stem` has cache files and all of them are exactly the ones we recorded;
    otherwise its cache files are deleted (numba will compile afresh) and False."""
    files = cache_files(ndir, stem)
    if not files:
        return False
    try:
        recorded = json.loads(_manifest(ndir, stem).read_text())
    except (OSError, ValueError):
        recorded = None
    if recorded is None or _digests(files) != recorded:
        discard(ndir, stem)
        return False
    return True


def write_manifest(ndir: Path, stem: str) -> None:
    """Record the sha256 of `stem`'s cache files as numba just wrote (or loaded) them."""
    digests = _digests(cache_files(ndir, stem))
    if not digests:
        return
    fd, tmp = tempfile.mkstemp(dir=ndir, prefix=".tmp_manifest_")
    with os.fdopen(fd, "w") as f:
        json.dump(digests, f)
    os.replace(tmp, _manifest(ndir, stem))
