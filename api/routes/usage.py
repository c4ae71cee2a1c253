"""/v1/usage: GPU-hours and CPU-slot-hours per owner and/or UTC day, read from the attempts (jobs/usage.py)."""

from __future__ import annotations

import csv
import io
import json
from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Header, Query, Response

from api.auth import PrincipalDep
from api.deps import SessionDep
from api.errors import invalid
from api.schemas import UsageOut
from jobs import usage
from jobs.models import utcnow

router = APIRouter(tags=["usage"])

CSV = "text/csv"


@router.get("/v1/usage", response_model=UsageOut,
            responses={200: {"content": {CSV: {"schema": {"type": "string"}}}, "description": "JSON, or CSV with Accept: text/csv."}},
            summary="GPU-hours and CPU-slot-hours per owner and/or day, from the attempts' placements and times "
                    "(a tenant sees its own)")
def get_usage(principal: PrincipalDep, session: SessionDep,
              start: Annotated[datetime | None, Query(alias="from", description="ISO time; all time when left out")] = None,
              end: Annotated[datetime | None, Query(alias="to", description="ISO time; now when left out")] = None,
              group_by: Annotated[str, Query(max_length=32, description="owner, day, or owner,day")] = "owner",
              accept: Annotated[str | None, Header(include_in_schema=False)] = None) -> Response:
    try:
        groups = usage.parse_group_by(group_by)
    except ValueError as exc:
        raise invalid("query", "group_by", str(exc)) from None
    if start is not None and end is not None and usage.as_utc(end) < usage.as_utc(start):
        raise invalid("query", "to", "to: is before from")
    owner = None if principal.is_admin else principal.owner
    now = utcnow()
    rows = usage.summarize(usage.read_spans(session, owner, start, end), start, end, now, groups)
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
