"""The hand-written loop bench/gpu_mfu.py measures the trainer against: one GPU, the catalog's gpt as the spec
builds it, written the way a careful engineer writes a single-GPU loop.

    python bench/gpu_loop.py SPEC.json OUT.json [--device cuda|cpu] [--no-compile]

The same model, initialisation (seed, then the dataset, then the model, as the trainer does), data order
(the trainer's sampler), schedule, clipping and AdamW settings as the trainer's run of SPEC, so the losses can
be compared step for step. What differs is the loop: the whole model and its loss compiled as one graph,
fused AdamW, bf16 autocast, TF32 for what stays fp32, every batch on the GPU before the first step (no copy
and no host sync in a step: the losses stay on the GPU until the end), and no DDP around the one GPU.

Writes OUT.json: tokens/s and samples/s over the steady window (a device sync at its two ends only), the
losses at the trainer's report steps, and the start-up by phase (imports, data, model, first step).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

STARTED = time.time()

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from jobspec.spec import parse_spec  # noqa: E402
from trainer.data import build_dataset  # noqa: E402
from trainer.data.loader import TrainBatches  # noqa: E402
from trainer.distributed import RankInfo  # noqa: E402
from trainer.models import build_model  # noqa: E402
from trainer.optim import lr_factor  # noqa: E402


def _process_start() -> float:
    try:
        import psutil

        return float(psutil.Process().create_time())
    except Exception:  # noqa: BLE001 - without it the imports phase starts at this module's first line
        return STARTED


def main(spec_path: str, out_path: str, device_type: str, compile_model: bool) -> None:
    phases: dict[str, float] = {}
    last = _process_start()

    def mark(name: str) -> None:
        nonlocal last
        now = time.time()
        phases[name] = round(now - last, 3)
        last = now

    mark("imports")
    spec = parse_spec(json.loads(Path(spec_path).read_text()))
    t = spec.train
    dev = torch.device(device_type)
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.cuda.init()
    mark("cuda_init")
    torch.manual_seed(t.seed)  # as the trainer: the seed, the dataset, then the model
    bundle = build_dataset(spec.data.name, spec.data.args, None)
    steps = t.max_steps or 1
    batches = TrainBatches(bundle.train, RankInfo(0, 0, 1, 1, torch.device("cpu"), "gloo"), t.global_batch_size, 1, t.seed)
    order = torch.cat([batches._indices(e) for e in range(-(-steps // batches.steps_per_epoch))])[:steps]
    xs, ys = zip(*(bundle.train.get_batch(i[0]) for i in order), strict=True)
    x_all, y_all = torch.stack(xs).to(dev), torch.stack(ys).to(dev)  # every step's batch on the device, once
    mark("data")
    model = build_model(spec.model.name, spec.model.args, bundle.info).to(dev)
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    fused = {"fused": True} if dev.type == "cuda" else {}
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": t.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=t.lr, betas=tuple(t.betas), **fused)
    params = list(model.parameters())
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(t.precision)
    mark("model")

    def forward_loss(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with torch.autocast(dev.type, dtype=dtype, enabled=dtype is not None):
            logits = model(x)
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.view(-1))

    step_fn = torch.compile(forward_loss) if compile_model else forward_loss
    every = t.log_every_steps
    losses: list[torch.Tensor] = []
    window = (max(2, steps // 4), steps)
    t_window = 0.0
    for step in range(1, steps + 1):
        if step == window[0] + 1:
            if dev.type == "cuda":
                torch.cuda.synchronize()
            t_window = time.perf_counter()
        loss = step_fn(x_all[step - 1], y_all[step - 1])
        loss.backward()
        if t.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(params, t.grad_clip, foreach=True)
        for g in opt.param_groups:
            g["lr"] = t.lr * lr_factor(step - 1, t.schedule, steps)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % every == 0 or step == steps:
            losses.append(loss.detach())
        if step == 1:
            if dev.type == "cuda":
                torch.cuda.synchronize()  # once: the first step's end, for the start-up figure
            mark("first_step")
    if dev.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - t_window
    n = window[1] - window[0]
    seq = bundle.info.input_shape[0]
    report_steps = [s for s in range(1, steps + 1) if s % every == 0 or s == steps]
    result = {
        "steps": steps, "window": list(window), "step_ms": round(elapsed / n * 1e3, 3),
        "samples_per_s": round(n * t.global_batch_size / elapsed, 1),
        "tokens_per_s": round(n * t.global_batch_size * seq / elapsed, 1),
        "losses": dict(zip(map(str, report_steps), torch.stack(losses).float().cpu().tolist(), strict=True)),
        "startup": {**phases, "since_process_start_s": round(sum(phases.values()), 3)},
        "peak_mem_bytes": torch.cuda.max_memory_allocated() if dev.type == "cuda" else None,
        "compiled": compile_model, "params": sum(p.numel() for p in params),
    }
    Path(out_path).write_text(json.dumps(result))


if __name__ == "__main__":
    args = sys.argv[1:]
    device = args[args.index("--device") + 1] if "--device" in args else "cuda"
    main(args[0], args[1], device, "--no-compile" not in args)
