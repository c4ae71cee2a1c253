"""The W&B run files a job writes become its metrics: a run written by the real wandb (offline, as a job without a
key runs it) read back whole, read while it grows, and a damaged one read up to the damage. The framing is also
checked as a property: any records, cut anywhere, come back whole and once."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.wandb_env import wandb_defaults
from worker.wandb_tail import BLOCK, CHUNK_HEADER, FILE_HEADER, FIRST, FULL, LAST, MIDDLE, WandbTail, records

WIDE = 3000  # one row of this many values is a record longer than a 32 KiB block: it spans three

RUN = textwrap.dedent(f'''
    import wandb
    run = wandb.init(project="fixture", config={{"lr": 0.1}})
    run.define_metric("trainer/global_step")
    run.define_metric("val/*", step_metric="trainer/global_step")
    for i in range(1, 4):
        run.log({{"train/loss": 1.0 / i, "nested": {{"acc": i / 10}}, "flag": True, "note": "text"}})
    run.log({{"val/loss": 0.5, "trainer/global_step": 300}})
    run.log({{f"wide/k{{j:05d}}": float(j) for j in range({WIDE})}}, step=10)
    run.log({{"train/loss": 0.125}}, step=11)
    run.finish()
''')


@pytest.fixture(scope="module")
def run_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run file written by the wandb the tests pin, offline, as a keyless job's ranks run it."""
    pytest.importorskip("wandb")
    where = tmp_path_factory.mktemp("wandb-run")
    (where / "log.py").write_text(RUN)
    env = {**os.environ, **wandb_defaults({}), "HOME": str(where)}
    env.pop("WANDB_API_KEY", None)
    done = subprocess.run([sys.executable, "log.py"], cwd=where, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (found,) = where.glob("wandb/offline-run-*/run-*.wandb")
    return found


def test_a_real_offline_run_reads_back_as_its_metrics(run_file: Path, tmp_path: Path) -> None:
    shutil.copytree(run_file.parent, tmp_path / "workdir" / "wandb" / run_file.parent.name)
    tail = WandbTail(tmp_path)
    points = tail.read()
    narrow = sorted((p.name, p.step, p.value) for p in points if not p.name.startswith("wide/"))
    assert narrow == sorted([
        ("train/loss", 0, 1.0), ("nested.acc", 0, 0.1),
        ("train/loss", 1, 0.5), ("nested.acc", 1, 0.2),
        ("train/loss", 2, 1 / 3), ("nested.acc", 2, 0.3),
        # define_metric("val/*", step_metric=...): at the step metric's value, as the W&B page plots it
        ("val/loss", 300, 0.5), ("trainer/global_step", 3, 300.0),
        ("train/loss", 11, 0.125),
    ])  # booleans and text are not metrics; wandb's own _step, _runtime and _timestamp are not either
    wide = sorted((p.name, p.step, p.value) for p in points if p.name.startswith("wide/"))
    assert wide == [(f"wide/k{j:05d}", 10, float(j)) for j in range(WIDE)]
    assert all(abs(p.time - points[0].time) < 600 for p in points)  # wandb's _timestamp, not the reading's

    # Held until stored: a read before the ack offers the same points again, none after it.
    assert tail.read() == points
    tail.ack(len(points))
    assert tail.read() == []


def test_a_run_read_while_it_is_written_gives_each_point_once(run_file: Path, tmp_path: Path) -> None:
    whole = run_file.read_bytes()
    assert len(whole) > 2 * BLOCK
    growing = tmp_path / "wandb" / "offline-run-x" / "run-x.wandb"
    growing.parent.mkdir(parents=True)
    growing.write_bytes(b"")
    tail = WandbTail(tmp_path, rescan_s=0)
    seen = []
    for end in [*range(0, len(whole), 4093), len(whole)]:  # cuts through headers, chunks and block tails
        growing.write_bytes(whole[:end])
        got = tail.read()
        tail.ack(len(got))
        seen.extend((p.name, p.step, p.value) for p in got)
    reference = WandbTail(run_file.parent)
    assert seen == [(p.name, p.step, p.value) for p in reference.read()]


def test_a_damaged_run_is_read_up_to_the_damage_and_others_go_on(run_file: Path, tmp_path: Path) -> None:
    whole = bytearray(run_file.read_bytes())
    whole[BLOCK + 100] ^= 0xFF  # inside the wide row's middle chunk
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "run-a.wandb").write_bytes(bytes(whole))
    (tmp_path / "b").mkdir()
    shutil.copy(run_file, tmp_path / "b" / "run-b.wandb")
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "run-c.wandb").write_bytes(b"not a wandb file at all, longer than the header")
    tail = WandbTail(tmp_path)
    names = [p.name for p in tail.read()]
    assert names.count("train/loss") == 3 + 4  # a's rows before the damage, all of b's; nothing of c
    assert names.count("wide/k00000") == 1


def test_a_run_file_swapped_for_a_link_to_another_jobs_is_not_read(run_file: Path, tmp_path: Path) -> None:
    mine, other = tmp_path / "mine" / "workdir", tmp_path / "other" / "workdir"
    mine.mkdir(parents=True)
    other.mkdir(parents=True)
    shutil.copy(run_file, other / "run-theirs.wandb")  # another job's metrics, readable by the worker
    planted = mine / "run-mine.wandb"
    planted.write_bytes(b"")  # found as a plain file, then a link to the other job's run in its place
    tail = WandbTail(mine.parent)
    assert tail.read() == [] and planted in tail.files
    planted.unlink()
    planted.symlink_to(other / "run-theirs.wandb")
    assert tail.read() == []


def frame(payloads: list[bytes]) -> bytes:
    """The LevelDB log framing wandb writes, after its header: each record cut into chunks at block ends."""
    out = bytearray(FILE_HEADER)
    for payload in payloads:
        rest, first = payload, True
        while True:
            left = BLOCK - len(out) % BLOCK
            if left < CHUNK_HEADER.size:
                out += b"\x00" * left
                continue
            piece, rest = rest[:left - CHUNK_HEADER.size], rest[left - CHUNK_HEADER.size:]
            kind = (FULL if not rest else FIRST) if first else (LAST if not rest else MIDDLE)
            out += CHUNK_HEADER.pack(zlib.crc32(piece, zlib.crc32(bytes([kind]))), len(piece), kind) + piece
            first = False
            if not rest:
                break
    return bytes(out)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 3 * BLOCK), max_size=8), st.lists(st.integers(0, 5 * BLOCK), max_size=6))
def test_records_come_back_whole_and_once_wherever_the_file_is_cut(sizes: list[int], cuts: list[int]) -> None:
    payloads = [struct.pack("<I", i) * (size // 4 + 1) for i, size in enumerate(sizes)]
    data = frame(payloads)
    got: list[bytes] = []
    offset = len(FILE_HEADER)
    for end in [*sorted(c for c in cuts if c >= offset), len(data)]:
        found, new_offset = records(data[offset:end], offset)
        assert new_offset >= offset
        got.extend(found)
        offset = new_offset
    assert got == payloads


def test_a_job_without_a_key_runs_wandb_offline_and_a_choice_of_its_own_stays() -> None:
    assert wandb_defaults({}) == {"WANDB_MODE": "offline"}
    assert wandb_defaults({"APP_X": "1", "WANDB_PROJECT": "p"}) == {"WANDB_MODE": "offline"}
    for chosen in ({"WANDB_API_KEY": "k"}, {"WANDB_MODE": "disabled"}, {"WANDB_DISABLED": "true"}):
        assert wandb_defaults(chosen) == {}


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        out.append(value & 0x7F | (0x80 if value > 0x7F else 0))
        value >>= 7
        if not value:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _history(name: str, value: str, step: int) -> bytes:
    """A Record holding one history row, as wandb_internal.proto numbers it."""
    item = _field(2, name.encode()) + _field(16, value.encode())
    return _field(2, _field(1, item) + _field(2, _varint(1 << 3) + _varint(step)))


def _read_and_ack(tail: WandbTail) -> list:
    got = tail.read()
    tail.ack(len(got))
    return got


def test_a_record_longer_than_one_read_is_read_and_one_too_long_stops_only_its_file(tmp_path: Path,
                                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from worker import wandb_tail

    long_record = _field(13, b"x" * (wandb_tail.MAX_READ + BLOCK))  # output_raw: not a metric, longer than a read
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "run-a.wandb").write_bytes(frame([long_record, _history("loss", "0.5", 7)]))
    tail = WandbTail(tmp_path)
    got = [p for _ in range(4) for p in _read_and_ack(tail)]  # the window widens until the record fits
    assert [(p.name, p.step, p.value) for p in got] == [("loss", 7, 0.5)]
    assert not tail.files[tmp_path / "a" / "run-a.wandb"].broken

    monkeypatch.setattr(wandb_tail, "MAX_RECORD", 2 * wandb_tail.MAX_READ)
    (tmp_path / "b").mkdir()
    huge = _field(13, b"y" * (3 * wandb_tail.MAX_READ))
    (tmp_path / "b" / "run-b.wandb").write_bytes(frame([huge, _history("acc", "0.9", 1)]))
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "run-c.wandb").write_bytes(frame([_history("acc", "0.8", 2)]))
    fresh = WandbTail(tmp_path / "b"), WandbTail(tmp_path / "c")
    assert [p for _ in range(4) for p in _read_and_ack(fresh[0])] == [] and next(iter(fresh[0].files.values())).broken
    assert [(p.name, p.step) for p in fresh[1].read()] == [("acc", 2)]
