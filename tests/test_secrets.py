"""A database password never shows: not in `tune`'s output, its log file or plan, not in
`tune-run --json`, not in `tune-db`, not in any error line (issue 10, item 2)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from onnx import TensorProto, helper
from sqlalchemy.engine import make_url

from database import Database, DatabaseError
from database.engine import mask
from ir.errors import TensortuneError, redact

ROOT = Path(__file__).resolve().parents[1]
SECRET = "Sup3rS3cretPw"


def relu_model(tmp_path) -> Path:
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])])
    path = tmp_path / "relu.onnx"
    path.write_bytes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    return path


def cli(module: str, *args, env=None, cwd=None):
    e = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    p = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, env=e, cwd=cwd,
                       timeout=300)
    return p.returncode, p.stdout, p.stderr


def with_password(url: str) -> str:
    """The test server trusts every login, so any password works: it must still never be shown."""
    return make_url(url).set(password=SECRET).render_as_string(hide_password=False)


def test_redact_rule():
    assert redact(f"postgresql+psycopg://tuner:{SECRET}@db.example:5432/tt") == \
        "postgresql+psycopg://tuner:***@db.example:5432/tt"
    assert SECRET not in redact(f"at 'postgresql://u:{SECRET[:4]}@{SECRET[4:]}@host/db' failed")  # unencoded @
    assert redact(f"postgresql://host/db?sslmode=require&password={SECRET}") == \
        "postgresql://host/db?sslmode=require&password=***"
    assert redact("host=h password=x dbname=d") == "host=h password=*** dbname=d"
    assert redact("see https://sqlalche.me/e/20/e3q8 at 12:30") == "see https://sqlalche.me/e/20/e3q8 at 12:30"
    assert mask("sqlite:///tuning.db") == "sqlite:///tuning.db"


def test_api_errors_are_masked(tmp_path):
    url = f"postgresql+psycopg://tuner:{SECRET}@127.0.0.1:1/none"
    with pytest.raises(DatabaseError) as e:
        Database(url)
    assert SECRET not in str(e.value) and "tuner:***@127.0.0.1:1" in str(e.value)
    # a driver's own wording that quotes the password: masked once the database was opened with it
    assert SECRET not in str(TensortuneError(f'connection to "{SECRET}" refused'))
    with pytest.raises(DatabaseError, match="%40"):
        Database(f"postgresql+psycopg://tuner:{SECRET}@x@127.0.0.1:1/none")


@pytest.mark.parametrize("module", ["tuner.cli", "runtime.cli"])
def test_cli_error_lines_are_masked(tmp_path, module):
    model = relu_model(tmp_path)
    args = ["--model", str(model), "--db", f"postgresql+psycopg://tuner:{SECRET}@127.0.0.1:1/none"]
    rc, out, err = cli(module, *args, *(["--trials", "2"] if module == "tuner.cli" else []))
    assert rc == 2 and SECRET not in out + err and "tuner:***@127.0.0.1:1" in err, err
    assert len(err.strip().splitlines()) == 1, err


def test_tune_db_masks_url_in_errors_help_and_json(tmp_path, pg_url):
    bad = f"postgresql+psycopg://tuner:{SECRET}@127.0.0.1:1/none"
    rc, out, err = cli("database.cli", "--db", bad, "stats")
    assert rc == 2 and SECRET not in out + err and "***" in err
    rc, out, err = cli("database.cli", "--help", env={"TENSORTUNE_DB": bad})
    assert rc == 0 and SECRET not in out and "tuner:***@127.0.0.1:1" in out
    rc, out, err = cli("database.cli", "--db", with_password(pg_url), "stats", "--json")
    assert rc == 0, err
    assert SECRET not in out + err and ":***@" in json.loads(out)["url"]


def test_tune_run_output_log_and_plan_are_masked(tmp_path, pg_url):
    """A whole `tune` run on PostgreSQL with a password, then `tune-run` on that database."""
    model, url = relu_model(tmp_path), with_password(pg_url)
    log, plan = tmp_path / "log.jsonl", tmp_path / "plan.json"
    rc, out, err = cli("tuner.cli", "--model", str(model), "--db", url, "--trials", "2", "--batch-size", "2",
                       "--strategy", "random", "--repeat", "1", "--number", "1", "--min-repeat-ms", "0",
                       "--measure-runs", "1", "--no-progress", "--log-file", str(log), "--plan", str(plan),
                       cwd=tmp_path)
    assert rc == 0, err
    assert "results in postgresql+psycopg://postgres:***@" in out
    for text in (out, err, log.read_text(), plan.read_text()):
        assert SECRET not in text
    assert json.loads(plan.read_text())["entries"]
    rc, out, err = cli("runtime.cli", "--model", str(model), "--db", url, "--json", cwd=tmp_path)
    assert rc == 0, err
    assert SECRET not in out + err and json.loads(out)["coverage"]
