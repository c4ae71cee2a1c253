"""/v1/usage: GPU-hours and CPU-slot-hours per owner and/or UTC day, read from the attempts (jobs/reads/usage.py)."""

from __future__ import annotations

import csv
import io
import json
from datetime import datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Header, Query, Response
from pydantic import BeforeValidator

from api.auth import PrincipalDep
from api.deps import SessionDep
from api.schemas import UsageOut
from jobs.reads import usage
from jobs.store.models import utcnow

router = APIRouter(tags=["usage"])


def _iso_only(value: object) -> object:
    """An ISO date or time only: pydantic would also read a bare number as seconds since 1970, which the
    documented format (date-time) does not admit."""
    if isinstance(value, str) and value.strip().lstrip("+-").replace(".", "", 1).isdigit():
        raise ValueError("is not an ISO date or time (e.g. 2026-11-01 or 2026-11-01T12:00:00Z)")
    return value

CSV = "text/csv"


@router.get("/v1/usage", response_model=UsageOut,
            responses={200: {"content": {CSV: {"schema": {"type": "string"}}}, "description": "JSON, or CSV with Accept: text/csv."}},
            summary="GPU-hours and CPU-slot-hours per owner and/or day, from the attempts' placements and times "
                    "(a tenant sees its own)")
def get_usage(principal: PrincipalDep, session: SessionDep,
              start: Annotated[datetime | None, BeforeValidator(_iso_only),
                               Query(alias="from", description="ISO date or time; all time when left out")] = None,
              end: Annotated[datetime | None, BeforeValidator(_iso_only),
                             Query(alias="to", description="ISO date or time; now when left out")] = None,
              group_by: Annotated[Literal["owner", "day", "owner,day", "day,owner"],
                                  Query(description="owner, day, or owner,day")] = "owner",
              accept: Annotated[str | None, Header(include_in_schema=False)] = None) -> Response:
    groups = usage.parse_group_by(group_by)  # the Literal above admits only what it parses
    now = utcnow()
    rows = usage.summarize(usage.read_spans(session, principal.scope, start, end), start, end, now, groups)
    items = [r.as_dict(groups) for r in rows]
    if accept and CSV in accept:
        out = io.StringIO()
        columns = [*groups, "gpu_hours", "cpu_slot_hours", "jobs", "attempts", "preempted_gpu_hours"]
        writer = csv.DictWriter(out, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(items)
        return Response(out.getvalue(), media_type=CSV)
    window = UsageOut(start=start, end=min(usage.as_utc(end), now) if end is not None else now, items=[])
    # Each row carries only the keys it is grouped by (no "day": null on a per-owner row).
    body = {**window.model_dump(mode="json", by_alias=True), "items": items}
    return Response(json.dumps(body).encode(), media_type="application/json")
