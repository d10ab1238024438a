"""`Database`: every measurement, and the queries the tuner and the runtime ask of them."""
from __future__ import annotations

import functools
import json
import math
import os
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Callable, Iterable

from sqlalchemy import bindparam, case, delete, func, select, update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from database.engine import current_revision, head_revision, make_engine, mask, sqlite_readonly, upgrade
from database.errors import DatabaseError
from database.models import ClaimRow as C
from database.models import RecordRow as R
from database.models import TargetRow as T
from database.models import WorkloadRow as W
from database.record import MEASURE_TRIES, STATUSES, Record, from_utc_naive, is_transient, to_utc_naive, utcnow
from ir.keys import config_hash, dynamic_dims, shape_distance


# built once: it runs with every stored result (add_many with an owner)
_DROP_CLAIM = C.__table__.delete().where(C.__table__.c.owner == bindparam("o"),
                                         C.__table__.c.workload_key == bindparam("w"),
                                         C.__table__.c.target_key == bindparam("t"),
                                         C.__table__.c.config_hash == bindparam("h"))


def default_url(settings=None) -> str:
    """The settings' database URL (the CLIs take it from $TENSORTUNE_DB), else ./tuning.db."""
    from ir.settings import resolve
    return resolve(settings).db_url or "sqlite:///tuning.db"


def _cause(e: BaseException) -> str:
    orig = getattr(e, "orig", None)
    msg = str(orig if orig is not None else e).strip() or type(e).__name__
    return msg.splitlines()[0]


def _guarded(method):
    """Database failures surface as one-line DatabaseErrors naming the (masked) URL."""

    @functools.wraps(method)
    def wrapper(self, *a, **kw):
        try:
            return method(self, *a, **kw)
        except SQLAlchemyError as e:
            raise DatabaseError(f"database {mask(self.url)}: {method.__name__} failed: {_cause(e)}") from None

    return wrapper


def _flops(rec: Record) -> int:
    if rec.flops:
        return int(rec.flops)
    try:
        from ir.workload import Workload

        return int(Workload.from_json(rec.workload).flops())
    except Exception:  # an unknown op: flops unknown, not an error
        return 0


def _to_record(row: R) -> Record:
    return Record(
        workload=row.workload.json, workload_key=row.workload.key, signature=row.workload.signature,
        family=row.workload.family, template=row.template, template_version=row.template_version,
        target=row.target.description, config=json.loads(row.config), status=row.status,
        latencies=list(row.latencies), median=row.median, spread=row.spread, error=row.error,
        compile_s=row.compile_s, strategy=row.strategy, flops=row.workload.flops,
        created_at=from_utc_naive(row.created_at), version=row.version, id=row.id)


class Database:
    """Records in SQLite (default, one file) or PostgreSQL (shared by a cluster).

    Every write commits at once, so a killed tuner loses nothing it finished. An SQLite
    file this process cannot write opens read-only (`readonly`): every query works, and
    every write fails at once with one line, before any work that would be lost.
    """

    def __init__(self, url: str | None = None):
        self.url = url or default_url()
        self._tcache: dict[str, int] = {}
        self._wcache: dict[str, tuple[int, int]] = {}  # key -> (id, template_version)
        self._read = self._write = None
        self.readonly = False
        try:
            self.readonly = sqlite_readonly(self.url)
            self._read, self._write = make_engine(self.url, readonly=self.readonly)
            if self.readonly:
                self._check_schema()
            else:
                upgrade(self._read, self._write)
        except DatabaseError:
            self.close()
            raise
        except Exception as e:
            self.close()
            raise DatabaseError(f"cannot open database {mask(self.url)}: {_cause(e)}") from None

    def _check_schema(self) -> None:
        """A read-only database cannot be migrated: it must be at the schema this version reads."""
        with self._read.connect() as conn:
            rev = current_revision(conn)
        if rev != head_revision():
            raise DatabaseError(f"database {mask(self.url)} is read-only and at schema revision {rev or 'none'} "
                                f"(this version needs {head_revision()}): open it once with write access to upgrade")

    def require_writable(self, why: str = "write to it") -> None:
        """Fail now, in one line, if this database cannot be written (call before costly work)."""
        if self.readonly:
            raise DatabaseError(f"database {mask(self.url)} is read-only: cannot {why}")

    def __repr__(self):
        return f"Database({mask(self.url)!r})"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        for e in {id(x): x for x in (self._read, self._write) if x is not None}.values():
            e.dispose()
        self._read = self._write = None

    # -- sessions ---------------------------------------------------------------------
    def _session(self) -> Session:
        if self._read is None:
            raise DatabaseError(f"database {mask(self.url)} is closed")
        return Session(self._read, expire_on_commit=False)

    @contextmanager
    def _writing(self):
        """One write transaction; id caches learn new rows only once it commits."""
        if self._write is None:
            raise DatabaseError(f"database {mask(self.url)} is closed")
        self.require_writable()
        pending_t, pending_w = {}, {}
        with Session(self._write, expire_on_commit=False) as s:
            with s.begin():
                yield s, pending_t, pending_w
        self._tcache.update(pending_t)
        self._wcache.update(pending_w)

    def _insert_ignore(self, s: Session, table, values: dict | list[dict], unique: tuple[str, ...] = ("key",)) -> None:
        """Insert the row(s) unless a row with the same `unique` columns exists (atomic where the backend can)."""
        rows = [values] if isinstance(values, dict) else values
        dialect = s.get_bind().dialect.name
        if dialect == "postgresql":
            from sqlalchemy.dialects.postgresql import insert
        elif dialect == "sqlite":
            from sqlalchemy.dialects.sqlite import insert
        else:  # other backends: plain insert after a look-up (no concurrent writers assumed)
            for row in rows:
                if s.scalar(select(table.c.id).where(*(table.c[c] == row[c] for c in unique))) is None:
                    s.execute(table.insert().values(**row))
            return
        s.execute(insert(table).values(rows).on_conflict_do_nothing(index_elements=list(unique)))

    def _target_id(self, s, pend, target: dict) -> int:
        key = target["key"]
        if key in self._tcache or key in pend:
            return self._tcache.get(key) or pend[key]
        self._insert_ignore(s, T.__table__, {"key": key, "kind": target.get("kind", "cpu"), "description": target})
        pend[key] = s.scalar(select(T.id).where(T.key == key))
        return pend[key]

    def _workload_id(self, s, pend, rec: Record) -> int:
        key = rec.workload_key
        got = self._wcache.get(key) or pend.get(key)
        if got is None:
            w = rec.workload
            self._insert_ignore(s, W.__table__, dict(
                key=key, signature=rec.signature, family=rec.family, template=rec.template,
                template_version=rec.template_version, json=w,
                shapes=[list(i.get("shape", [])) for i in w.get("inputs", [])],
                dims=dynamic_dims(w.get("inputs", [])), dtype=w.get("output_dtype", "float32"), flops=_flops(rec)))
            got = tuple(s.execute(select(W.id, W.template_version).where(W.key == key)).one())
        if rec.template_version > got[1]:  # a revised template now serves this workload
            s.execute(update(W).where(W.id == got[0]).values(template=rec.template, template_version=rec.template_version))
            got = (got[0], rec.template_version)
        pend[key] = got
        return got[0]

    @staticmethod
    def _check(rec: Record) -> None:
        if rec.status not in STATUSES:
            raise DatabaseError(f"record status {rec.status!r} is not one of {', '.join(STATUSES)}")
        if not isinstance(rec.target, dict) or not isinstance(rec.target.get("key"), str):
            raise DatabaseError(f"record target {rec.target!r} has no 'key'")
        if rec.status == "ok" and rec.median is None:
            raise DatabaseError(f"record of workload {rec.workload_key} has status ok but no median")

    def _insert(self, s, pt, pw, recs: list[Record]) -> list[R]:
        rows = []
        for rec in recs:
            self._check(rec)
            rows.append(R(
                workload_id=self._workload_id(s, pw, rec), target_id=self._target_id(s, pt, rec.target),
                template=rec.template, template_version=rec.template_version,
                config=json.dumps(rec.config, sort_keys=True), config_hash=config_hash(rec.config),
                latencies=[float(x) for x in rec.latencies], median=rec.median, spread=rec.spread,
                status=rec.status, error=rec.error or "", compile_s=rec.compile_s, strategy=rec.strategy or "",
                created_at=to_utc_naive(rec.created_at) if rec.created_at else utcnow(), version=rec.version or ""))
        s.add_all(rows)
        s.flush()
        return rows

    # -- writes -----------------------------------------------------------------------
    def add(self, rec: Record) -> int:
        return self.add_many([rec])[0]

    @_guarded
    def add_many(self, recs: Iterable[Record], owner: str | None = None) -> list[int]:
        """Add and commit; sets `id` and `created_at` on the given records. `owner`: the
        claims it holds on these configs go in the same transaction (see `claim`)."""
        recs = list(recs)
        with self._writing() as (s, pt, pw):
            rows = self._insert(s, pt, pw, recs)
            if owner is not None and recs:
                s.connection().execute(_DROP_CLAIM, [{"o": owner, "w": rec.workload_key, "t": rec.target_key,
                                                      "h": rec.config_hash} for rec in recs])
        for rec, row in zip(recs, rows):
            rec.id, rec.created_at = row.id, from_utc_naive(row.created_at)
        return [row.id for row in rows]

    # -- claims: concurrent tuners never measure one config twice ------------------------
    @_guarded
    def claim(self, workload_key: str, target_key: str, hashes: list[str], owner: str, ttl_s: float,
              known: dict[str, int] | None = None, alive: Callable[[str], bool] | None = None) -> list[str]:
        """Claim configs (by hash) for measuring by `owner` for `ttl_s` seconds; returns
        those granted, in order.

        Refused: configs another owner holds (unless its claim has expired, or `alive`
        says that owner is gone: a crashed tuner), and with `known` (hash -> number of
        records the caller knows of) configs that have gained records since: another
        tuner measured them meanwhile. The record count is read after the claim is
        inserted, so a tuner that stores a record and drops its claim in one transaction
        is always seen by one or the other.
        """
        if not hashes:
            return []
        now = utcnow()
        here = (C.workload_key == workload_key, C.target_key == target_key)
        with self._writing() as (s, _, _):
            s.execute(delete(C).where(*here, C.expires_at < now), execution_options={"synchronize_session": False})
            if alive is not None:
                holders = set(s.scalars(select(C.owner).where(*here, C.config_hash.in_(hashes), C.owner != owner)))
                dead = [o for o in holders if not alive(o)]
                if dead:
                    s.execute(delete(C).where(C.owner.in_(dead)), execution_options={"synchronize_session": False})
            until = now + timedelta(seconds=ttl_s)
            self._insert_ignore(s, C.__table__, [dict(workload_key=workload_key, target_key=target_key, config_hash=h,
                                                      owner=owner, expires_at=until) for h in dict.fromkeys(hashes)],
                                unique=("workload_key", "target_key", "config_hash"))
            mine = set(s.scalars(select(C.config_hash).where(
                C.owner == owner, C.workload_key == workload_key, C.target_key == target_key,
                C.config_hash.in_(hashes))))
            if known is not None and mine:
                counts = dict(s.execute(
                    select(R.config_hash, func.count()).join(W, R.workload_id == W.id).join(T, R.target_id == T.id)
                    .where(W.key == workload_key, T.key == target_key, R.config_hash.in_(mine))
                    .group_by(R.config_hash)).all())
                stale = {h for h in mine if counts.get(h, 0) != known.get(h, 0)}
                if stale:
                    s.execute(delete(C).where(C.owner == owner, C.workload_key == workload_key,
                                              C.target_key == target_key, C.config_hash.in_(stale)),
                              execution_options={"synchronize_session": False})
                    mine -= stale
        return [h for h in dict.fromkeys(hashes) if h in mine]

    @_guarded
    def release(self, owner: str) -> int:
        """Drop every claim of `owner` (a tuner that stops); returns how many there were."""
        if self.readonly:
            return 0
        with self._writing() as (s, _, _):
            return s.execute(delete(C).where(C.owner == owner), execution_options={"synchronize_session": False}).rowcount

    @_guarded
    def claims(self, workload_key: str | None = None) -> list[dict]:
        """Live and expired claims (for `stats` and tests)."""
        stmt = select(C).order_by(C.id)
        if workload_key is not None:
            stmt = stmt.where(C.workload_key == workload_key)
        with self._session() as s:
            return [{"workload_key": c.workload_key, "target_key": c.target_key, "config_hash": c.config_hash,
                     "owner": c.owner, "expires_at": from_utc_naive(c.expires_at)} for c in s.scalars(stmt)]

    # -- queries ----------------------------------------------------------------------
    @staticmethod
    def _where(workload_key=None, target_key=None, template=None, status=None, family=None, signature=None):
        conds = []
        for col, v in ((W.key, workload_key), (T.key, target_key), (R.template, template),
                       (R.status, status), (W.family, family), (W.signature, signature)):
            if v is not None:
                conds.append(col == v)
        return conds

    @staticmethod
    def _ranked(conds, partition_by, n: int):
        """ok records ranked by median within each partition, the first `n` of each kept."""
        rn = func.row_number().over(partition_by=partition_by, order_by=(R.median.asc(), R.id.asc())).label("rn")
        sub = (select(R.id.label("rid"), rn).join(W, R.workload_id == W.id).join(T, R.target_id == T.id)
               .where(R.status == "ok", R.median.is_not(None), *conds).subquery())
        return select(R).join(sub, R.id == sub.c.rid).where(sub.c.rn <= n)

    @_guarded
    def best(self, workload_key: str, target_key: str | None = None, k: int = 1) -> list[Record]:
        """The k fastest distinct configs (status ok, by median)."""
        stmt = self._ranked(self._where(workload_key, target_key), (R.target_id, R.config_hash), 1)
        with self._session() as s:
            rows = s.scalars(stmt.order_by(R.median, R.id).limit(k)).unique().all()
            return [_to_record(r) for r in rows]

    @_guarded
    def best_per_workload(self, target_key=None, family=None, template=None) -> list[Record]:
        """The fastest record of each (workload, target)."""
        stmt = self._ranked(self._where(target_key=target_key, family=family, template=template),
                            (R.workload_id, R.target_id), 1)
        with self._session() as s:
            rows = s.scalars(stmt).unique().all()
            recs = [_to_record(r) for r in rows]
        return sorted(recs, key=lambda r: (r.family, r.workload_key, r.target_key))

    @_guarded
    def nearest(self, signature: str, dims: dict[str, int], target_key=None, template=None) -> Record | None:
        """Best record of the same-signature workload whose dynamic dims are closest in log2 space."""
        stmt = self._ranked(self._where(target_key=target_key, template=template, signature=signature),
                            (R.workload_id,), 1)
        with self._session() as s:
            rows = s.scalars(stmt).unique().all()
            scored = [(shape_distance(dict(dims), r.workload.dims), r.median, r.id, r) for r in rows]
            scored = [x for x in scored if x[0] != math.inf]
            return _to_record(min(scored, key=lambda x: x[:3])[3]) if scored else None

    @_guarded
    def measured(self, workload_key: str, target_key: str) -> dict[str, float | None]:
        """config_hash -> best median (None: only failures), so the tuner never re-measures."""
        stmt = (select(R.config_hash, R.status, R.median).join(W, R.workload_id == W.id)
                .join(T, R.target_id == T.id).where(*self._where(workload_key, target_key)))
        out: dict[str, float | None] = {}
        with self._session() as s:
            for h, status, median in s.execute(stmt):
                m = median if status == "ok" else None
                prev = out.get(h)
                if h not in out or (m is not None and (prev is None or m < prev)):
                    out[h] = m
        return out

    @_guarded
    def retryable(self, workload_key: str, target_key: str, tries: int = MEASURE_TRIES) -> dict[str, tuple[dict, int]]:
        """Configs whose every record is a transient failure (a killed worker, a timeout, a
        MemoryError) and that have been tried fewer than `tries` times: config_hash ->
        (config, number of records). Failures of the config itself are final."""
        stmt = (select(R.config_hash, R.config, R.status, R.error).join(W, R.workload_id == W.id)
                .join(T, R.target_id == T.id).where(*self._where(workload_key, target_key)).order_by(R.id))
        seen: dict[str, list] = {}
        with self._session() as s:
            for h, cfg, status, error in s.execute(stmt):
                entry = seen.setdefault(h, [cfg, 0, True])
                entry[1] += 1
                entry[2] = entry[2] and is_transient(status, error)
        return {h: (json.loads(cfg), n) for h, (cfg, n, transient) in seen.items() if transient and n < tries}

    def _select_records(self, conds, order, limit=None):
        stmt = select(R).join(W, R.workload_id == W.id).join(T, R.target_id == T.id).where(*conds).order_by(*order)
        if limit is not None:
            stmt = stmt.limit(limit)
        with self._session() as s:
            return [_to_record(r) for r in s.scalars(stmt).unique().all()]

    @_guarded
    def records(self, workload_key=None, target_key=None, template=None, status=None, limit=None) -> list[Record]:
        return self._select_records(self._where(workload_key, target_key, template, status), (R.id,), limit)

    @_guarded
    def history(self, workload_key: str, target_key: str | None = None) -> list[Record]:
        return self._select_records(self._where(workload_key, target_key), (R.created_at, R.id))

    @_guarded
    def workloads(self, family=None, template=None) -> list[dict]:
        agg = (select(R.workload_id, func.count().label("n"),
                      func.min(case((R.status == "ok", R.median))).label("best"))
               .group_by(R.workload_id).subquery())
        stmt = select(W, agg.c.n, agg.c.best).outerjoin(agg, agg.c.workload_id == W.id)
        if family is not None:
            stmt = stmt.where(W.family == family)
        if template is not None:
            stmt = stmt.where(W.template == template)
        with self._session() as s:
            rows = s.execute(stmt.order_by(W.family, W.key)).all()
        return [{"key": w.key, "signature": w.signature, "family": w.family, "template": w.template,
                 "version": w.template_version, "shapes": w.shapes, "dims": w.dims, "dtype": w.dtype,
                 "flops": w.flops, "n_records": n or 0, "best_median": best} for w, n, best in rows]

    @_guarded
    def stats(self) -> dict:
        with self._session() as s:
            n_rec, compile_s, first, last = s.execute(
                select(func.count(R.id), func.sum(R.compile_s), func.min(R.created_at), func.max(R.created_at))).one()
            by_status = dict(s.execute(select(R.status, func.count()).group_by(R.status)).all())
            return {"workloads": s.scalar(select(func.count(W.id))), "targets": s.scalar(select(func.count(T.id))),
                    "records": n_rec, "by_status": dict(sorted(by_status.items())),
                    "compile_s": float(compile_s or 0.0),
                    "first": from_utc_naive(first).isoformat() if first else None,
                    "last": from_utc_naive(last).isoformat() if last else None}

    # -- import / export ----------------------------------------------------------------
    @_guarded
    def export_jsonl(self, path) -> int:
        """Write every record as one JSON line (atomically: temp file, then rename)."""
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        n = 0
        try:
            with self._session() as s, open(tmp, "w", encoding="utf-8") as f:
                for row in s.scalars(select(R).order_by(R.id).execution_options(yield_per=500)):
                    f.write(json.dumps(_to_record(row).to_json(), sort_keys=True) + "\n")
                    n += 1
            os.replace(tmp, path)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise DatabaseError(f"cannot write {path}: {e.strerror or e}") from None
        return n

    @_guarded
    def import_jsonl(self, path) -> tuple[int, int]:
        """Add the records of a JSON-lines file, all or nothing: (added, skipped as duplicates)."""
        from database.jsonl import read_records

        recs = read_records(path)
        with self._writing() as (s, pt, pw):
            seen: dict[tuple, set] = {}
            fresh = []
            for rec in recs:
                pair = (rec.workload_key, rec.target["key"])
                if pair not in seen:
                    q = (select(R.config_hash, R.created_at).join(W, R.workload_id == W.id)
                         .join(T, R.target_id == T.id).where(W.key == pair[0], T.key == pair[1]))
                    seen[pair] = {(h, t) for h, t in s.execute(q)}
                ident = (rec.config_hash, to_utc_naive(rec.created_at) if rec.created_at else None)
                if ident[1] is not None and ident in seen[pair]:
                    continue
                seen[pair].add(ident)
                fresh.append(rec)
            self._insert(s, pt, pw, fresh)
        return len(fresh), len(recs) - len(fresh)

    # -- maintenance --------------------------------------------------------------------
    @_guarded
    def prune(self, keep_top_k: int | None = None, failures_older_than_days: float | None = None) -> int:
        """Delete ok records beyond the k best per (workload, target) and/or failures older than N days.

        Workloads and targets left without records go too; SQLite files are VACUUMed.
        """
        deleted = 0
        with self._writing() as (s, _, _):
            if keep_top_k is not None:
                rn = func.row_number().over(partition_by=(R.workload_id, R.target_id),
                                            order_by=(R.median.asc(), R.id.asc())).label("rn")
                ranked = select(R.id.label("rid"), rn).where(R.status == "ok").subquery()
                doomed = select(ranked.c.rid).where(ranked.c.rn > keep_top_k)
                deleted += s.execute(delete(R).where(R.id.in_(doomed)), execution_options={"synchronize_session": False}).rowcount
            if failures_older_than_days is not None:
                cutoff = utcnow() - timedelta(days=failures_older_than_days)
                deleted += s.execute(delete(R).where(R.status != "ok", R.created_at < cutoff),
                                     execution_options={"synchronize_session": False}).rowcount
            s.execute(delete(W).where(~select(R.id).where(R.workload_id == W.id).exists()),
                      execution_options={"synchronize_session": False})
            s.execute(delete(T).where(~select(R.id).where(R.target_id == T.id).exists()),
                      execution_options={"synchronize_session": False})
        self._tcache.clear()
        self._wcache.clear()
        if self._write.dialect.name == "sqlite":
            raw = self._write.raw_connection()
            try:
                raw.driver_connection.execute("VACUUM")
            finally:
                raw.close()
        return deleted
