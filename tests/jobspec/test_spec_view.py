"""The stored spec's view answers what the parsed spec says, and a row missing a section reads as its defaults."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from jobspec.spec import spec_from_dict
from jobspec.view import StoredSpec


@given(nnodes=st.integers(1, 4), nproc=st.sampled_from([1, 2, 8, "gpu"]), device=st.sampled_from(["auto", "cpu", "cuda"]),
       timeout=st.one_of(st.none(), st.integers(1, 30 * 86_400)), script=st.booleans())
def test_the_view_of_a_stored_spec_is_what_the_spec_says(nnodes: int, nproc: int | str, device: str, timeout: int | None,
                                                         script: bool) -> None:
    raw: dict = {"name": "x", "parallel": {"nnodes": nnodes, "nproc_per_node": nproc, "device": device}}
    catalog = {"model": {"name": "mlp"}, "data": {"name": "synthetic-classification"}}
    raw.update({"kind": "script", "entrypoint": "train.py"} if script else catalog)
    if timeout is not None:
        raw["timeout_s"] = timeout
    spec = spec_from_dict(raw)
    view = StoredSpec.of(spec.visible_dump())
    assert (view.kind, view.nnodes, view.nproc_per_node, view.device) == (spec.kind, nnodes, nproc, device)
    assert view.timeout_s == spec.timeout_s and not view.pipeline


def test_a_row_without_the_sections_reads_as_the_spec_defaults() -> None:
    defaults = spec_from_dict({"name": "x", "model": {"name": "mlp"}, "data": {"name": "synthetic-classification"}})
    view = StoredSpec.of({"parallel": None})
    assert (view.kind, view.nnodes, view.nproc_per_node, view.device, view.timeout_s) == (
        "catalog", defaults.parallel.nnodes, defaults.parallel.nproc_per_node, defaults.parallel.device, defaults.timeout_s)
