"""A job's row, attempts, transitions and secret names in one SQL statement (GET /v1/jobs/{id}).

Four statements were four round trips on PostgreSQL, each costing more than its query; one statement is one, and
on both databases it reads the four from one snapshot. Attempts and transitions come back as JSON arrays built
by the database (``json_agg`` on PostgreSQL, ``json_group_array`` on SQLite), one array per row in a fixed column
order; their timestamps arrive as the stored text and are made aware UTC datetimes here, as ``UTCDateTime`` does.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import psycopg
import sqlalchemy as sa

from jobs.store.models import Attempt, Job, JobSecret, Transition, UTCDateTime

_JOB_COLUMNS = list(Job.__table__.columns)  # type: ignore[attr-defined]
_ATTEMPT_COLUMNS = [c for c in Attempt.__table__.columns if c.name != "job_id"]  # type: ignore[attr-defined]
_TRANSITION_COLUMNS = [c for c in Transition.__table__.columns if c.name not in ("id", "job_id")]  # type: ignore[attr-defined]


@dataclass(frozen=True)
class JobRows:
    values: dict[str, Any]  # the job's columns, as the table's types load them
    attempts: list[dict[str, Any]]  # Attempt's columns but job_id, oldest first
    transitions: list[dict[str, Any]]  # Transition's columns but id and job_id, oldest first
    secret_names: list[str]


def _sql(dialect: str) -> str:
    jobs, attempts, transitions = Job.__tablename__, Attempt.__tablename__, Transition.__tablename__
    job_cols = ", ".join(f"j.{c.name}" for c in _JOB_COLUMNS)
    a_cols = ", ".join(c.name for c in _ATTEMPT_COLUMNS)
    t_cols = ", ".join(c.name for c in _TRANSITION_COLUMNS)
    if dialect == "postgresql":
        a_agg = f"SELECT json_agg(json_build_array({a_cols}) ORDER BY attempt) FROM {attempts} WHERE job_id = j.id"
        t_agg = f"SELECT json_agg(json_build_array({t_cols}) ORDER BY id) FROM {transitions} WHERE job_id = j.id"
    else:
        # SQLite before 3.44 has no ORDER BY inside an aggregate; it aggregates an ordered subquery in its order.
        a_agg = (f"SELECT json_group_array(json_array({a_cols})) FROM "
                 f"(SELECT {a_cols} FROM {attempts} WHERE job_id = :job_id ORDER BY attempt)")
        t_agg = (f"SELECT json_group_array(json_array({t_cols})) FROM "
                 f"(SELECT {t_cols} FROM {transitions} WHERE job_id = :job_id ORDER BY id)")
    return (f"SELECT {job_cols}, ({a_agg}) AS detail_attempts, ({t_agg}) AS detail_transitions, "
            f"(SELECT names FROM {JobSecret.__tablename__} WHERE job_id = j.id) AS detail_secret_names "
            f"FROM {jobs} j WHERE j.id = :job_id")


def _statement(dialect: str) -> sa.TextClause:
    return sa.text(_sql(dialect)).columns(
        *[sa.column(c.name, c.type) for c in _JOB_COLUMNS],
        sa.column("detail_attempts", sa.JSON), sa.column("detail_transitions", sa.JSON),
        sa.column("detail_secret_names", sa.JSON),
    )


_STATEMENTS = {name: _statement(name) for name in ("postgresql", "sqlite")}
_SQLITE_SQL = _sql("sqlite")


def _utc(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text).replace(tzinfo=timezone.utc) if text is not None else None


def _json(text: str | None) -> Any:
    return json.loads(text) if text is not None else None


# What SQLAlchemy's types do to SQLite's values of the job's columns (UTCDateTime: stored text; JSON: text), in order.
_SQLITE_LOADS = [_utc if isinstance(c.type, UTCDateTime) else _json if isinstance(c.type, sa.JSON) else None for c in _JOB_COLUMNS]
_JOB_NAMES = [c.name for c in _JOB_COLUMNS]


def _loader(columns: list[sa.Column[Any]]) -> Any:
    names = [c.name for c in columns]
    stamps = [i for i, c in enumerate(columns) if isinstance(c.type, UTCDateTime)]
    # SQLite's json_array takes a JSON column's text as a string; PostgreSQL's json_build_array nests the value.
    nested = [i for i, c in enumerate(columns) if isinstance(c.type, sa.JSON)]

    def load(arrays: list[list[Any]] | None) -> list[dict[str, Any]]:
        out = []
        for values in arrays or ():
            for i in stamps:
                values[i] = _utc(values[i])
            for i in nested:
                if isinstance(values[i], str):
                    values[i] = json.loads(values[i])
            out.append(dict(zip(names, values, strict=True)))
        return out

    return load


_load_attempts, _load_transitions = _loader(_ATTEMPT_COLUMNS), _loader(_TRANSITION_COLUMNS)


def read(conn: sa.Connection, job_id: str) -> JobRows | None:
    """The job ``job_id`` with its attempts, transitions and secret names; None if there is no such job."""
    row = conn.execute(_STATEMENTS[conn.dialect.name], {"job_id": job_id}).first()
    if row is None:
        return None
    values = dict(row._mapping)
    attempts, transitions = values.pop("detail_attempts"), values.pop("detail_transitions")
    names = values.pop("detail_secret_names")
    return JobRows(values, _load_attempts(attempts), _load_transitions(transitions), list(names or []))


def _rows(row: Any, job_loads: list[Any], parse_json: Any) -> JobRows:
    n = len(_JOB_NAMES)
    values = {name: (load(v) if load is not None else v) for name, load, v in zip(_JOB_NAMES, job_loads, row[:n], strict=True)}
    attempts, transitions, names = (parse_json(v) for v in row[n:])
    return JobRows(values, _load_attempts(attempts), _load_transitions(transitions), list(names or []))


# psycopg decodes json itself and returns naive datetimes for PostgreSQL's ``timestamp``: UTCDateTime makes them aware.
_PG_SQL = _sql("postgresql").replace(":job_id", "%(job_id)s")
_PG_LOADS = [(lambda v: v.replace(tzinfo=timezone.utc) if v is not None else None) if isinstance(c.type, UTCDateTime) else None
             for c in _JOB_COLUMNS]


async def read_psycopg_async(conn: psycopg.AsyncConnection[Any], job_id: str) -> JobRows | None:
    """``read`` on a psycopg async connection (autocommit): the same statement and values, awaited in the event loop."""
    async with conn.cursor() as cur:
        await cur.execute(_PG_SQL, {"job_id": job_id})
        row = await cur.fetchone()
    return _rows(row, _PG_LOADS, lambda v: v) if row is not None else None


def read_sqlite(conn: sqlite3.Connection, job_id: str) -> JobRows | None:
    """``read`` on a plain sqlite3 connection: the same statement and the same values, without SQLAlchemy's
    execution and result machinery, which cost several times the query (api.job_reader runs it in the event loop)."""
    rows = conn.execute(_SQLITE_SQL, {"job_id": job_id}).fetchall()  # fetched whole: the read ends here
    if not rows:
        return None
    return _rows(rows[0], _SQLITE_LOADS, _json)
