"""Which stored checkpoint a resume starts from: only one whose manifest is there and whose every file is there at
its size, the newest of those."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobs.storage.manifest import Manifest, ManifestError, complete, manifest_key, newest_complete, step_of

files = st.dictionaries(st.from_regex(r"[a-z]{1,6}(/[a-z0-9_.]{1,8})?", fullmatch=True), st.integers(0, 10**9), max_size=5)


@st.composite
def stores(draw: st.DrawFn) -> tuple[list[Manifest], dict[str, int]]:
    """Checkpoints in every state an upload can leave: whole, without a manifest, a file missing or cut short."""
    manifests, listing = [], {}
    for step in draw(st.lists(st.integers(0, 10**6), unique=True, max_size=6)):
        m = Manifest(f"step_{step:08d}", draw(files), step)
        manifests.append(m)
        state = draw(st.sampled_from(["whole", "no manifest", "file missing", "file short"]))
        for path, size in m.files.items():
            listing[f"{m.name}/{path}"] = size
        if state != "no manifest":
            listing[manifest_key(m.name)] = len(m.to_json())
        if m.files and state in ("file missing", "file short"):
            victim = f"{m.name}/{sorted(m.files)[0]}"
            if state == "file missing":
                del listing[victim]
            else:
                listing[victim] = m.files[sorted(m.files)[0]] + 1
    return manifests, listing


@given(stores())
def test_the_choice_is_complete_and_the_newest_complete(state: tuple[list[Manifest], dict[str, int]]) -> None:
    manifests, listing = state
    chosen = newest_complete(manifests, listing)
    whole = [m for m in manifests if manifest_key(m.name) in listing
             and all(listing.get(f"{m.name}/{p}") == s for p, s in m.files.items())]
    if not whole:
        assert chosen is None
        return
    assert chosen is not None and chosen in whole
    assert chosen.step == max(m.step for m in whole if m.step is not None)


@given(files, st.integers(0, 10**6))
def test_a_manifest_reads_back_as_written(listed: dict[str, int], step: int) -> None:
    m = Manifest(f"step_{step:08d}", listed, step)
    assert Manifest.from_json(m.name, m.to_json()) == m
    assert m.size == sum(listed.values())


def test_a_checkpoint_without_its_manifest_is_never_chosen() -> None:
    m = Manifest("step_00000010", {"model.distcp": 5}, 10)
    assert newest_complete([m], {"step_00000010/model.distcp": 5}) is None
    assert not complete(m, {manifest_key(m.name): 10})  # the manifest alone: its file never arrived


def test_a_newer_half_uploaded_checkpoint_leaves_the_older_whole_one_chosen() -> None:
    old = Manifest("step_00000010", {"a": 1}, 10)
    new = Manifest("step_00000020", {"a": 1, "b": 2}, 20)
    listing = {"step_00000010/a": 1, manifest_key(old.name): 9, "step_00000020/a": 1, manifest_key(new.name): 9}
    assert newest_complete([old, new], listing) == old


@pytest.mark.parametrize("data", [b"", b"{", b"[]", b'{"format": 1, "name": "other", "files": {}}',
                                  b'{"format": 1, "name": "step_1", "files": {"a": -1}}', b'{"format": 2, "name": "step_1", "files": {}}'])
def test_an_unreadable_manifest_is_refused(data: bytes) -> None:
    with pytest.raises(ManifestError):
        Manifest.from_json("step_1", data)


def test_step_of_names() -> None:
    assert step_of("step_00000050") == 50
    assert step_of("checkpoint-50") is None
