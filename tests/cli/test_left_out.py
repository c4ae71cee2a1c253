"""`torchyard submit --workdir` warns when .gitignore/.torchyardignore keep out files the script names by path,
and says how to put them back; the job is still submitted as packed. Against a live API (no worker)."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from tests.cli.conftest import cli
from tests.helpers import Services
from tests.worker.test_bundle_jobs import write
from torchyard.client.left_out import candidates, check, left_out, literals

TRAIN = '''
import numpy as np
from pathlib import Path
data = np.memmap("data/train.bin")  # prepared by prepare.py, ignored by git
tokenizer = Path(__file__).parent / "assets" / "vocab.json"
with open("config/base.yaml") as f:
    pass
print("epoch", f"{1}")
'''


def repo(tmp_path: Path) -> Path:
    return write(tmp_path / "repo", {
        "train.py": TRAIN,
        "config/base.yaml": "lr: 1\n",
        "data/train.bin": "x", "data/val.bin": "y",
        "vocab.json": "{}",  # named and packed: nothing to warn about
        ".gitignore": "data/\n*.log\n",
        "run.log": "ignored and never named",
    })


def test_submit_workdir_warns_about_ignored_files_the_script_names(services: Services, tmp_path: Path) -> None:
    services.start_api()
    spec = tmp_path / "job.yaml"
    spec.write_text("kind: script\nname: nano\nentrypoint: train.py\n")
    code, out = cli(services, "submit", str(spec), "--workdir", str(repo(tmp_path)))
    assert code == 0, out
    words = " ".join(out.split())
    assert "warning: data/train.bin is left out of the upload by .gitignore/.torchyardignore, but train.py names it" in words
    assert "list it with '!' in .torchyardignore" in words
    assert "run.log" not in words and "config/base.yaml" not in words and "submitted" in words


def test_a_named_directory_counts_its_left_out_files_and_a_re_included_one_is_quiet(tmp_path: Path) -> None:
    root = repo(tmp_path)
    (root / "train.py").write_text('DATA = "data"\n')
    [item] = check(root, "train.py")
    assert (item.path, item.files, item.named_in) == ("data/", 2, "train.py")
    (root / ".torchyardignore").write_text("!data/\n")
    assert check(root, "train.py") == []


def test_literals_skip_what_cannot_be_a_path() -> None:
    assert literals('x = "a.txt"\ny = """two\nlines"""\nz = "https://h/x"\n') == ["a.txt"]
    assert literals("def broken(:\n") == []
    assert candidates("../outside", "") == [] and candidates("/abs", "") == []
    assert candidates("cfg.yaml", "src") == ["cfg.yaml", "src/cfg.yaml"]


paths = st.lists(st.sampled_from(["a", "b", "d/x", "d/y", "d/e/z", "s/c"]), unique=True)


@given(paths, paths, st.lists(st.sampled_from(["a", "b", "d", "d/x", "d/e", "x", "../a", "c"]), max_size=6))
def test_a_warning_names_exactly_the_existing_paths_the_bundle_lacks(disk_files: list[str], packed_files: list[str],
                                                                       texts: list[str]) -> None:
    on_disk = {f: 1 for f in disk_files}
    for f in disk_files:
        parts = f.split("/")
        on_disk.update({"/".join(parts[:i]): 0 for i in range(1, len(parts))})
    packed = set(packed_files) & set(disk_files)
    warned = {w.path.rstrip("/"): w for w in left_out({"s/train.py": texts}, on_disk, packed)}
    for text in texts:
        for path in candidates(text, "s"):
            lacking = [f for f in disk_files if (f == path or f.startswith(path + "/")) and f not in packed]
            assert (path in warned) == (path in on_disk and bool(lacking)), (path, warned)
            if path in warned:
                assert warned[path].files == len(lacking)

