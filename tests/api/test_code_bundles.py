"""Code bundles: POST /v1/code against a live API with a tenant key (every archive attack refused whole,
nothing written; the size cap; deduplication per owner), a script spec resolving inside its bundle, the
canonical packing of a working directory, and the worker's read-only unpacking."""

from __future__ import annotations

import gzip
import io
import os
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from jobs.code_bundles import files as bundles
from jobs.settings import Settings
from jobs.store.db import get_engine
from tests.conftest import make_settings
from tests.helpers import ROOT, Services
from torchyard.client.pack import PackError, pack

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
    # Names no filesystem holds: a component over 255 bytes (a file, a directory), a path past what fits under PATH_MAX.
    ("long file name", tar_of(GOOD, member("a" * 256 + ".py")), "a" * 256 + ".py"),
    ("long directory name", tar_of(GOOD, member("d" * 300 + "/x.py")), "d" * 300 + "/x.py"),
    ("long path", tar_of(GOOD, member("/".join(["p" * 200] * 20) + "/x.py")), "/".join(["p" * 200] * 20) + "/x.py"),
]


def no_files_under(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if not p.is_dir()] if root.exists() else []


def test_archive_attacks_are_refused_whole_and_nothing_is_written(services: Services) -> None:
    services.start_api(TORCHYARD_MAX_CODE_BYTES=str(CAP), TORCHYARD_MAX_CODE_UNPACKED_BYTES=str(CAP // 2))
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
        # A gzip body is one gzip stream, whole: bytes after its end (garbage, or a second stream) and a cut one answer 422.
        packed = gzip.compress(tar_of(GOOD))
        for what, body, why in [("trailing garbage", [packed + b"garbage"], "after the end"),
                                ("garbage in a later chunk", [packed, b"\x00" * 10], "after the end"),
                                ("a second stream", [packed, gzip.compress(tar_of(member("evil.py")))], "after the end"),
                                ("truncated", [packed[:-9]], "ends early")]:
            resp = c.post("/v1/code", content=iter(body), headers={"Content-Encoding": "gzip"})
            assert resp.status_code == 422 and why in resp.json()["detail"], (what, resp.text)
            assert resp.headers["content-type"].startswith("application/problem+json")
        # A name that is not UTF-8 is named escaped (JSON cannot carry the raw bytes), never a 500.
        raw = io.BytesIO()
        with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT, encoding="utf-8", errors="surrogateescape") as tar:
            info = tarfile.TarInfo("\udcff" * 300 + ".py")
            tar.addfile(info, io.BytesIO(b""))
        resp = c.post("/v1/code", content=raw.getvalue())
        assert resp.status_code == 422 and resp.json()["member"] == "\\xff" * 300 + ".py", resp.text
        # Files that add up to more than TORCHYARD_MAX_CODE_UNPACKED_BYTES, though the archive is under its own cap.
        many = tar_of(GOOD, *[member(f"part{i}.bin", data=os.urandom(CAP // 4)) for i in range(3)])
        assert len(many) < CAP
        resp = c.post("/v1/code", content=many)
        assert resp.status_code == 413 and "TORCHYARD_MAX_CODE_UNPACKED_BYTES" in resp.json()["detail"], resp.text
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


def tenant_client(services: Services, owner: str) -> httpx.Client:
    with services.client() as admin:
        key = admin.post("/v1/keys", json={"owner": owner, "name": owner}).json()["key"]
    return httpx.Client(base_url=services.url, headers={"Authorization": f"Bearer {key}"}, timeout=60)


def test_sparse_members_count_at_their_full_size(services: Services, tmp_path: Path) -> None:
    """`truncate -s 2G zeros.bin; tar --sparse` makes a 10 KiB archive that unpacks to 2 GiB: refused with 413 from the
    member list, under the default TORCHYARD_MAX_CODE_UNPACKED_BYTES (1 GiB), before anything is unpacked or stored."""
    if shutil.which("tar") is None or "GNU tar" not in subprocess.run(["tar", "--version"], capture_output=True, text=True).stdout:
        pytest.skip("needs GNU tar to write sparse members")
    services.start_api()
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text("print('hi')\n")
    with (work / "zeros.bin").open("wb") as f:
        f.truncate(2 << 30)
    root = services.settings.bundles_root
    with tenant_client(services, "sparse") as c:
        for fmt in ("pax", "gnu", "oldgnu"):
            archive = tmp_path / f"{fmt}.tar"
            subprocess.run(["tar", "--sparse", f"--format={fmt}", "-C", str(work), "-cf", str(archive), "train.py", "zeros.bin"],
                           check=True)
            assert archive.stat().st_size < 64 * 1024, fmt
            resp = c.post("/v1/code", content=archive.read_bytes())
            assert resp.status_code == 413, (fmt, resp.text)
            assert resp.headers["content-type"].startswith("application/problem+json")
            assert "TORCHYARD_MAX_CODE_UNPACKED_BYTES" in resp.json()["detail"]
            assert no_files_under(root) == [], fmt
            assert not any(p.is_dir() and p.name != ".incoming" for p in root.iterdir()), fmt
        # A sparse file under the cap is an ordinary bundle, unpacked at its full size.
        with (work / "zeros.bin").open("wb") as f:
            f.truncate(1 << 20)
        archive = tmp_path / "small.tar"
        subprocess.run(["tar", "--sparse", "--format=pax", "-C", str(work), "-cf", str(archive), "train.py", "zeros.bin"], check=True)
        resp = c.post("/v1/code", content=archive.read_bytes())
        assert resp.status_code == 201, resp.text
        tree = bundles.tree_path(services.settings, "sparse", resp.json()["digest"])
        assert (tree / "zeros.bin").stat().st_size == 1 << 20


UNPRIVILEGED_UID = 10001  # the uid the images run the API and the worker as


@pytest.fixture
def as_unprivileged() -> list[str]:
    """A command prefix that runs a process as uid 10001, with no privilege to write anything that uid does not own."""
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None:
        pytest.skip("needs root and setpriv to start the API as another user")
    plain = [setpriv, f"--reuid={UNPRIVILEGED_UID}", f"--regid={UNPRIVILEGED_UID}", "--clear-groups"]
    # Where the interpreter lives in a directory that uid cannot enter (a pyenv under /root), it may read
    # (CAP_DAC_READ_SEARCH) but still writes only what it owns, which is what this test is about.
    for wrap in (plain, [*plain, "--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search"]):
        probe = subprocess.run([*wrap, sys.executable, "-c", "import api.app"], capture_output=True, cwd=ROOT,
                               env={**os.environ, "PYTHONPATH": str(ROOT)})
        if probe.returncode == 0:
            return wrap
    pytest.skip(f"this interpreter does not run as uid {UNPRIVILEGED_UID}: {probe.stderr.decode()[-300:]}")


@pytest.fixture
def shared_work() -> Iterator[Path]:
    """A work directory other uids can traverse (pytest's own are 0700 root)."""
    work = Path(tempfile.mkdtemp(prefix="torchyard-bundles-"))
    work.chmod(0o755)
    try:
        yield work
    finally:
        get_engine.cache_clear()
        shutil.rmtree(work, ignore_errors=True)


def test_uploads_work_for_an_api_running_as_a_non_root_user(as_unprivileged: list[str], shared_work: Path, redis_url: str,
                                                            tmp_path: Path) -> None:
    """The images run the API as uid 10001. Every upload answered 500 there: the unpacked tree was made read-only, then
    moved into the owner's directory, which a non-root user cannot do to a directory it may not write. The store it
    keeps is that user's alone: directories 0700, files 0600."""
    for name in ("runs", "db"):
        (shared_work / name).mkdir()
        os.chown(shared_work / name, UNPRIVILEGED_UID, UNPRIVILEGED_UID)
    settings = make_settings(shared_work, f"sqlite:///{shared_work / 'db' / 'torchyard.db'}", redis_url)
    services = Services(settings, tmp_path / "logs")
    work = tmp_path / "work"
    (work / "pkg").mkdir(parents=True)
    (work / "train.py").write_text("print('hello')\n")
    (work / "pkg" / "__init__.py").write_text("")
    (work / "pkg" / "main.py").write_text("print('pkg')\n")
    try:
        services.start_api(wrap=as_unprivileged)
        assert services.api is not None and psutil.Process(services.api.pid).uids().effective == UNPRIVILEGED_UID
        with tenant_client(services, "alice") as alice, pack(work) as packed:
            resp = alice.post("/v1/code", content=packed.chunks(gzip=True), headers={"Content-Encoding": "gzip"})
            assert resp.status_code == 201, resp.text
            assert alice.post("/v1/code", content=b"".join(packed.chunks())).status_code == 200
            spec = {"kind": "script", "name": "b", "entrypoint": "pkg.main", "code": packed.digest}
            assert alice.post("/v1/jobs", json=spec).status_code == 201
    finally:
        services.stop()
    root = settings.bundles_root
    stored = [root, *root.rglob("*")]
    assert len(stored) >= 7  # root, .incoming, owner dir, archive, tree, its files
    for path in stored:
        st = path.lstat()
        assert st.st_uid == UNPRIVILEGED_UID, path
        assert stat.S_IMODE(st.st_mode) == (0o700 if path.is_dir() else 0o600), (path, oct(st.st_mode))


def test_a_path_too_long_for_where_the_store_is_names_its_member(settings: Settings, tmp_path: Path) -> None:
    """Under the member-name limits, yet longer than PATH_MAX once under the store's own (long) path: the filesystem's
    ENAMETOOLONG is the archive's fault, refused naming the member, and nothing is kept."""
    deep = tmp_path.joinpath(*["s" * 200] * 7)
    store = settings.model_copy(update={"bundles_dir": deep})
    name = "/".join(["m" * 250] * 11) + "/x.py"
    assert len(name) < 3072 and len(str(deep)) + len(name) > 4096
    with pytest.raises(bundles.BundleRefused) as refused:
        stored(store, "alice", tar_of(GOOD, member(name)))
    assert refused.value.member == name and "cannot hold" in refused.value.reason
    assert no_files_under(deep) == []
