"""Reading JSON-lines exports safely: data only, every field type-checked, every
config validated against its template's space, before anything is written.

Nothing here evaluates or unpickles: a line is `json.loads`ed (NaN/Infinity
refused), must be an object with exactly the known `Record` fields, and its
workload must hash to its key.
"""
from __future__ import annotations

import json
import math
from datetime import datetime
from pathlib import Path

import numpy as np

from database.errors import DatabaseError
from database.record import FIELD_NAMES, STATUSES, Record

_REQUIRED = ("workload", "workload_key", "signature", "family", "template", "template_version",
             "target", "config", "status", "latencies", "median")
_ALLOWED = set(FIELD_NAMES)  # "id" is accepted and ignored: the importing database numbers rows


class _Bad(Exception):
    pass


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _need(cond: bool, what: str) -> None:
    if not cond:
        raise _Bad(what)


def _reject_constant(name):
    raise _Bad(f"{name} is not allowed (only finite numbers)")


def _plain_json(v, where: str, depth: int = 0) -> None:
    """Only JSON scalars, lists and string-keyed objects, not too deep."""
    _need(depth < 32, f"{where} is nested too deeply")
    if isinstance(v, dict):
        for k, x in v.items():
            _plain_json(x, f"{where}.{k}", depth + 1)
    elif isinstance(v, list):
        for x in v:
            _plain_json(x, where, depth + 1)
    else:
        _need(v is None or isinstance(v, (str, bool, int, float)), f"{where} holds a {type(v).__name__}")


def _check_fields(d: dict) -> None:
    unknown = sorted(set(d) - _ALLOWED)
    _need(not unknown, f"unknown field(s) {', '.join(unknown)}")
    missing = [f for f in _REQUIRED if f not in d]
    _need(not missing, f"missing field(s) {', '.join(missing)}")
    for f in ("workload_key", "signature", "family", "template"):
        _need(isinstance(d[f], str) and d[f] != "", f"'{f}' must be a non-empty string")
    for f in ("error", "strategy", "version"):
        _need(isinstance(d.get(f, ""), str), f"'{f}' must be a string")
    for f in ("template_version", "flops"):
        v = d.get(f, 0)
        _need(isinstance(v, int) and not isinstance(v, bool) and v >= 0, f"'{f}' must be a non-negative integer")
    for f in ("workload", "target", "config"):
        _need(isinstance(d[f], dict), f"'{f}' must be an object")
        _plain_json(d[f], f)
    _need(isinstance(d["target"].get("key"), str) and d["target"]["key"], "'target.key' must be a non-empty string")
    _need(isinstance(d["target"].get("kind"), str), "'target.kind' must be a string")
    _need(d["status"] in STATUSES, f"'status' {d['status']!r} is not one of {', '.join(STATUSES)}")
    _need(isinstance(d["latencies"], list) and all(_num(x) and x >= 0 for x in d["latencies"]),
          "'latencies' must be a list of non-negative numbers")
    for f in ("median", "spread", "compile_s"):
        v = d.get(f)
        _need(v is None or (_num(v) and v >= 0), f"'{f}' must be a non-negative number or null")
    _need(d["status"] != "ok" or d["median"] is not None, "status ok needs a median")
    if d.get("id") is not None:
        _need(isinstance(d["id"], int) and not isinstance(d["id"], bool), "'id' must be an integer")


def _check_workload(d: dict):
    from ir.workload import Workload

    try:
        w = Workload.from_json(d["workload"])
        key, sig = w.key, w.signature
    except Exception as e:
        raise _Bad(f"'workload' is not a valid workload ({type(e).__name__}: {e})") from None
    _need(key == d["workload_key"], f"'workload_key' {d['workload_key']} does not match its workload (hash {key})")
    _need(sig == d["signature"], f"'signature' {d['signature']} does not match its workload ({sig})")
    return w


# Generous physical bounds: no record may claim to beat them (a forged or corrupt timing
# would otherwise win every `best` query). Per core: 64 FLOP/cycle (2 AVX-512 FMA units on
# float32) and 128 bytes/cycle from cache, at 5 GHz; memory at least 1 TB/s in all.
PEAK_FLOP_PER_CYCLE, PEAK_BYTES_PER_CYCLE, PEAK_HZ, PEAK_MEMORY_BPS = 64, 128, 5e9, 1e12
# a target that does not say its core count (another kind of device): an absurdly high peak
UNKNOWN_TARGET_FLOPS, UNKNOWN_TARGET_BPS = 1e16, 1e14


def peak_rates(target: dict) -> tuple[float, float]:
    """(FLOP/s, bytes/s) that no kernel on `target` can exceed."""
    cores = target.get("cores")
    if target.get("kind") != "cpu" or not (isinstance(cores, int) and not isinstance(cores, bool) and cores > 0):
        return UNKNOWN_TARGET_FLOPS, UNKNOWN_TARGET_BPS
    return (cores * PEAK_FLOP_PER_CYCLE * PEAK_HZ,
            max(PEAK_MEMORY_BPS, cores * PEAK_BYTES_PER_CYCLE * PEAK_HZ))


def _check_plausible(d: dict, workload) -> None:
    """The timings must not be faster than the target's peak FLOP/s or bandwidth allows for
    the workload's FLOPs (counted from the workload, not the record's own field) and the
    bytes of its output, which every kernel must at least write."""
    times = [t for t in [d["median"], *d["latencies"]] if t is not None]
    if not times:
        return
    fastest = min(times)
    flops, bps = peak_rates(d["target"])
    try:
        work = workload.flops()
        out_bytes = math.prod(workload.output_shape) * np.dtype(workload.output_dtype).itemsize
    except Exception as e:
        raise _Bad(f"'workload' cannot be sized ({type(e).__name__}: {e})") from None
    floor = max(work / flops, out_bytes / bps)
    _need(fastest >= floor and (fastest > 0 or floor == 0),
          f"implausible timing: {fastest:.3g} s for {work} FLOPs and {out_bytes} output bytes is faster than "
          f"target {d['target']['key']} can run ({floor:.3g} s at its peak of {flops / 1e9:.4g} GFLOP/s, "
          f"{bps / 1e9:.4g} GB/s)")


def _check_config(d: dict, workload) -> dict:
    try:
        from schedules import registry
    except ImportError as e:
        raise _Bad(f"cannot validate config: schedules.registry unavailable ({e})") from None
    try:
        template = registry.get_template(d["template"])
    except Exception as e:
        raise _Bad(f"unknown template {d['template']!r} ({e})") from None
    import inspect
    # a record from another machine is checked against the space of its own target (register
    # tiles follow the vector width) where the template's space depends on the target
    takes_target = "target" in inspect.signature(template.space).parameters and isinstance(d.get("target"), dict)
    try:
        space = template.space(workload, target=d["target"]) if takes_target else template.space(workload)
        return space.validate(d["config"]).to_json()
    except Exception as e:
        raise _Bad(f"config does not fit template {d['template']!r}: {e}") from None


def _created_at(v) -> datetime | None:
    if v is None:
        return None
    _need(isinstance(v, str), "'created_at' must be an ISO 8601 string or null")
    try:
        return datetime.fromisoformat(v)
    except ValueError:
        raise _Bad(f"'created_at' {v!r} is not an ISO 8601 time") from None


def parse_line(line: str) -> Record:
    try:
        d = json.loads(line, parse_constant=_reject_constant)
    except json.JSONDecodeError as e:
        raise _Bad(f"not valid JSON ({e.msg} at column {e.colno})") from None
    except RecursionError:
        raise _Bad("nested too deeply") from None
    _need(isinstance(d, dict), "a line must be a JSON object")
    _check_fields(d)
    w = _check_workload(d)
    config = _check_config(d, w)
    _check_plausible(d, w)
    d = {k: v for k, v in d.items() if k != "id"}
    d["config"] = config
    d["created_at"] = _created_at(d.get("created_at"))
    return Record(**d)


def read_records(path) -> list[Record]:
    """Every record of the file, or a DatabaseError naming the first bad line."""
    path = Path(path)
    try:
        f = open(path, encoding="utf-8")
    except OSError as e:
        raise DatabaseError(f"cannot read {path}: {e.strerror or e}") from None
    out = []
    with f:
        try:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    out.append(parse_line(line))
                except _Bad as e:
                    raise DatabaseError(f"{path}:{n}: bad record: {e}; nothing imported") from None
        except UnicodeDecodeError:
            raise DatabaseError(f"{path}: not a UTF-8 text file; nothing imported") from None
    return out
