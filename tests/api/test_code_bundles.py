"""Code bundles: POST /v1/code against a live API with a tenant key (every archive attack refused whole,
nothing written; the size cap; deduplication per owner), a script spec resolving inside its bundle, the
canonical packing of a working directory, and the worker's read-only unpacking."""

from __future__ import annotations

import gzip
import io
import os
import stat
import tarfile
from pathlib import Path

import httpx
import pytest

from client.pack import PackError, pack
from jobs import bundles
from jobs.settings import Settings
from tests.helpers import Services

CAP = 256 * 1024


@pytest.fixture
def database_url(sqlite_url: str) -> str:
    return sqlite_url


def tar_of(*members: Member) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


Member = tuple[tarfile.TarInfo, bytes | None]


def member(name: str, kind: bytes = tarfile.REGTYPE, data: bytes | None = b"x = 1\n", link: str = "") -> Member:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, link, 0o644
    return info, data if kind == tarfile.REGTYPE else None


GOOD = member("train.py", data=b"print('hi')\n")
ATTACKS: list[tuple[str, bytes, str]] = [
    ("absolute path", tar_of(GOOD, member("/etc/cron.d/evil")), "/etc/cron.d/evil"),
    ("dot-dot", tar_of(GOOD, member("pkg/../../evil.py")), "pkg/../../evil.py"),
    ("character device", tar_of(GOOD, member("dev/null", tarfile.CHRTYPE)), "dev/null"),
    ("block device", tar_of(GOOD, member("sda", tarfile.BLKTYPE)), "sda"),
    ("FIFO", tar_of(GOOD, member("pipe", tarfile.FIFOTYPE)), "pipe"),
    ("hard link", tar_of(GOOD, member("passwd", tarfile.LNKTYPE, link="/etc/passwd")), "passwd"),
    ("hard link inside", tar_of(GOOD, member("again.py", tarfile.LNKTYPE, link="train.py")), "again.py"),
    ("absolute symlink", tar_of(GOOD, member("etc", tarfile.SYMTYPE, link="/etc")), "etc"),
    ("symlink up", tar_of(GOOD, member("up", tarfile.SYMTYPE, link="../../..")), "up"),
    # Each link alone looks harmless ('a' -> the root, 'c' -> 'a/..'), but 'c' resolves to the root's parent.
    ("symlink chain", tar_of(GOOD, member("b", tarfile.DIRTYPE), member("a", tarfile.SYMTYPE, link="b/.."),
                             member("c", tarfile.SYMTYPE, link="a/..")), "c"),
    ("write through a symlink", tar_of(GOOD, member("sub", tarfile.DIRTYPE), member("ln", tarfile.SYMTYPE, link="sub"),
                                       member("ln/x.py")), "ln/x.py"),
    ("duplicate member", tar_of(GOOD, member("train.py", data=b"import os\n")), "train.py"),
]


def no_files_under(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if not p.is_dir()] if root.exists() else []


def test_archive_attacks_are_refused_whole_and_nothing_is_written(services: Services) -> None:
    services.start_api(TORCHYARD_MAX_CODE_BYTES=str(CAP))
    root = services.settings.bundles_root
    with services.client() as admin:
        tenant = admin.post("/v1/keys", json={"owner": "mallory", "name": "attacker"}).json()["key"]
    headers = {"Authorization": f"Bearer {tenant}", "Content-Type": "application/x-tar"}
    with httpx.Client(base_url=services.url, headers=headers, timeout=30) as c:
        for what, body, name in ATTACKS:
            resp = c.post("/v1/code", content=body)
            assert resp.status_code == 422, (what, resp.text)
            assert resp.headers["content-type"].startswith("application/problem+json")
            assert resp.json()["member"] == name, (what, resp.json())
            assert name in resp.json()["detail"]
            assert no_files_under(root) == [], what
        for what, body in [("not a tar", b"MZ" + os.urandom(4000)), ("broken gzip", b"\x1f\x8b\x08\x00garbage")]:
            enc = {"Content-Encoding": "gzip"} if what == "broken gzip" else {}
            assert c.post("/v1/code", content=body, headers=enc).status_code == 422, what
        # Too large: declared up front, streamed without a length, and a small gzip body that inflates past the cap.
        big = tar_of(GOOD, member("weights.bin", data=os.urandom(CAP)))
        assert c.post("/v1/code", content=big).status_code == 413
        resp = c.post("/v1/code", content=iter([big[i:i + 65536] for i in range(0, len(big), 65536)]))
        assert resp.status_code == 413 and "TORCHYARD_MAX_CODE_BYTES" in resp.json()["detail"]
        bomb = gzip.compress(tar_of(GOOD, member("zeros.bin", data=bytes(64 * CAP))))
        assert len(bomb) < CAP // 4
        assert c.post("/v1/code", content=bomb, headers={"Content-Encoding": "gzip"}).status_code == 413
        assert no_files_under(root) == []
        assert not any(p.is_dir() and p.name != ".incoming" for p in root.iterdir())  # no owner directory either

        # The announced digest is checked against the body.
        good = tar_of(GOOD)
        wrong = "sha256:" + "0" * 64
        assert c.post("/v1/code", content=good, params={"digest": wrong}).status_code == 422
        assert no_files_under(root) == []


def test_upload_dedupe_per_owner_and_a_spec_resolving_inside_its_bundle(services: Services, tmp_path: Path) -> None:
    services.start_api()
    work = tmp_path / "work"
    (work / "pkg").mkdir(parents=True)
    (work / "train.py").write_text("print('hello')\n")
    (work / "pkg" / "__init__.py").write_text("")
    (work / "pkg" / "main.py").write_text("print('pkg')\n")
    (work / "pkg" / "link.py").symlink_to("main.py")
    with services.client() as admin:
        keys = {o: admin.post("/v1/keys", json={"owner": o, "name": o}).json()["key"] for o in ("alice", "bob")}
    alice = httpx.Client(base_url=services.url, headers={"Authorization": f"Bearer {keys['alice']}"}, timeout=30)
    bob = httpx.Client(base_url=services.url, headers={"Authorization": f"Bearer {keys['bob']}"}, timeout=30)
    with alice, bob, pack(work) as packed:
        body = b"".join(packed.chunks())
        assert alice.head(f"/v1/code/{packed.digest}").status_code == 404
        first = alice.post("/v1/code", content=packed.chunks(gzip=True), headers={"Content-Encoding": "gzip"})
        assert first.status_code == 201, first.text
        assert first.json()["digest"] == packed.digest and first.json()["size_bytes"] == len(body) == packed.size_bytes
        assert first.json()["files"] == 3  # regular files; the symlink is not one
        assert alice.post("/v1/code", content=body).status_code == 200  # stored once
        assert alice.post("/v1/code", params={"digest": packed.digest}, content=b"").status_code == 200  # known: body unread
        assert alice.head(f"/v1/code/{packed.digest}").status_code == 200
        assert alice.get(f"/v1/code/{packed.digest}").json()["files"] == 3
        # Another owner cannot see or use alice's bundle, not even whether it exists.
        assert bob.head(f"/v1/code/{packed.digest}").status_code == 404
        spec = {"kind": "script", "name": "b", "entrypoint": "train.py", "code": packed.digest}
        refused = bob.post("/v1/jobs", json=spec)
        assert refused.status_code == 422 and refused.json()["errors"][0]["field"] == "code"

        assert alice.post("/v1/jobs", json=spec).status_code == 201
        assert alice.post("/v1/jobs", json={**spec, "entrypoint": "pkg.main"}).status_code == 201
        assert alice.post("/v1/jobs", json={**spec, "entrypoint": "pkg/link.py"}).status_code == 201
        missing = alice.post("/v1/jobs", json={**spec, "entrypoint": "nope.py"})
        assert missing.status_code == 422 and missing.json()["errors"][0]["field"] == "entrypoint"
        assert missing.json()["errors"][0]["message"] == "'nope.py': no such file in the uploaded directory"
        # A bundle does not widen the entrypoint allow-list: installed modules still need TORCHYARD_SCRIPT_MODULES.
        for outside in ("pip", "json.tool", "../train.py"):
            refused = alice.post("/v1/jobs", json={**spec, "entrypoint": outside})
            assert refused.status_code == 422 and refused.json()["errors"][0]["field"] == "entrypoint", (outside, refused.text)
        malformed = alice.post("/v1/jobs", json={**spec, "code": "sha256:XYZ"})
        assert malformed.status_code == 422 and malformed.json()["errors"][0]["field"] == "code"

        for bad in ("-e .", "--index-url=https://evil.example/simple", "pkg @ https://evil.example/pkg.whl", "./local",
                    "git+https://evil.example/repo.git", "-r /etc/passwd", "tqdm; rm -rf /"):
            resp = alice.post("/v1/jobs", json={**spec, "requirements": ["tomli-w==1.2.0", bad]})
            assert resp.status_code == 422, (bad, resp.text)
            assert [e["field"] for e in resp.json()["errors"]] == ["requirements.1"], (bad, resp.json())
        assert alice.post("/v1/jobs", json={**spec, "requirements": ["tomli-w==1.2.0", "tqdm[notebook]>=4; python_version>'3'"]}
                          ).status_code == 201


def write_tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_packing_is_canonical_and_honours_ignore_files(tmp_path: Path) -> None:
    files = {
        "train.py": "print(1)\n", "run.sh": "#!/bin/sh\n", "data/big.bin": "x" * 1000, "data/keep.bin": "k",
        "sub/.gitignore": "*.log\n", "sub/a.log": "log", "sub/b.txt": "b", "notes.tmp": "t",
        ".gitignore": "data/*\n!data/keep.bin\n__pycache__/\n", ".torchyardignore": "*.tmp\n",
        "__pycache__/x.pyc": "c", ".git/HEAD": "ref", "pkg/.git": "gitdir: elsewhere",
    }
    one, two = tmp_path / "one", tmp_path / "two"
    write_tree(one, files)
    write_tree(two, dict(reversed(files.items())))  # created in another order, at other times
    (one / "run.sh").chmod(0o755)
    (two / "run.sh").chmod(0o700)
    os.utime(two / "train.py", (1, 1))
    with pack(one) as a, pack(two) as b:
        assert a.digest == b.digest and a.size_bytes == b.size_bytes
        assert a.paths == [".gitignore", ".torchyardignore", "data", "data/keep.bin", "pkg", "run.sh", "sub", "sub/.gitignore",
                           "sub/b.txt", "train.py"]
        with tarfile.open(fileobj=io.BytesIO(b"".join(a.chunks())), mode="r:") as tar:
            infos = {m.name: m for m in tar.getmembers()}
            assert {m.mtime for m in infos.values()} == {0} and {(m.uid, m.gid, m.uname) for m in infos.values()} == {(0, 0, "")}
            assert infos["run.sh"].mode == 0o755 and infos["train.py"].mode == 0o644
    (one / "train.py").write_text("print(2)\n")
    with pack(one) as changed:
        assert changed.digest != a.digest
    (one / "escape").symlink_to(tmp_path)
    with pytest.raises(PackError, match="escape"):
        pack(one)


def stored(settings: Settings, owner: str, body: bytes) -> str:
    upload = bundles.Upload(settings, owner)
    upload.write(body)
    return upload.finish().digest


def test_worker_unpacks_once_read_only_and_checks_the_stored_archive(settings: Settings, tmp_path: Path) -> None:
    body = tar_of(member("pkg", tarfile.DIRTYPE), member("pkg/train.py"), member("ln.py", tarfile.SYMTYPE, link="pkg/train.py"))
    digest = stored(settings, "alice", body)
    run_dir = tmp_path / "runs" / "job1"
    run_dir.mkdir(parents=True)
    code = bundles.unpack_for_job(settings, "alice", digest, run_dir)
    assert code == run_dir / "code" and (code / "ln.py").read_text() == "x = 1\n"
    assert stat.S_IMODE((code / "pkg" / "train.py").stat().st_mode) == 0o444
    assert stat.S_IMODE((code / "pkg").stat().st_mode) == 0o555 and stat.S_IMODE(code.stat().st_mode) == 0o555
    if os.geteuid() != 0:  # root writes anywhere; the modes above are what other users meet
        with pytest.raises(PermissionError):
            (code / "pkg" / "new.py").write_text("")
    mtime = code.stat().st_mtime_ns
    assert bundles.unpack_for_job(settings, "alice", digest, run_dir) == code and code.stat().st_mtime_ns == mtime  # once per job

    # Another owner's job cannot unpack alice's bundle; a stored archive changed behind our back is refused.
    with pytest.raises(bundles.BundleMissing):
        bundles.unpack_for_job(settings, "bob", digest, tmp_path / "runs" / "job2")
    archive = bundles.archive_path(settings, "alice", digest)
    archive.chmod(0o644)
    archive.write_bytes(tar_of(member("pkg/train.py", data=b"import evil\n")))
    (tmp_path / "runs" / "job3").mkdir()
    with pytest.raises(bundles.BundleRefused, match="does not match"):
        bundles.unpack_for_job(settings, "alice", digest, tmp_path / "runs" / "job3")
    assert not (tmp_path / "runs" / "job3" / "code").exists()
    bundles.remove_tree(code)
    assert not code.exists()


def test_every_attack_is_caught_by_the_member_check_alone(tmp_path: Path) -> None:
    def check(body: bytes) -> list[tarfile.TarInfo]:
        with tarfile.open(fileobj=io.BytesIO(body)) as tar:
            return bundles.check_members(tar)

    for what, body, name in ATTACKS:
        with pytest.raises(bundles.BundleRefused) as refused:
            check(body)
        assert refused.value.member == name, what
    ok = check(tar_of(member("./", tarfile.DIRTYPE), GOOD, member("d", tarfile.DIRTYPE),
                      member("d/l", tarfile.SYMTYPE, link="../train.py")))
    assert [m.name for m in ok] == ["train.py", "d", "d/l"]
