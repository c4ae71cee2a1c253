"""The training loop. It holds no policy: the checkpointer decides when to save, the reporter
when to log, the stop signal when to stop; parallel.py decides how the model is wrapped."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from jobspec.exit_codes import PAUSE_AT_ENV, PAUSED_PHASE, PREEMPTED_EXIT_CODE
from jobspec.spec import JobSpec
from torchyard import sinks
from torchyard.events import EventWriter
from trainer import faults, startup, tasks
from trainer.checkpoint import Checkpointer, TrainPosition
from trainer.data import build_dataset
from trainer.data.loader import TrainBatches, eval_batches
from trainer.distributed import RankInfo
from trainer.metrics import MetricsReporter
from trainer.models import build_model, full_args, model_spec
from trainer.optim import build_optimizer, build_scheduler
from trainer.parallel import Parallelized, compile_enabled, grad_scaler, parallelize, reshard, start_background_imports
from trainer.preemption import StopSignal, pause_step
from trainer.profiling import StepProfiler

log = logging.getLogger(__name__)


def _grad_norm_and_clip(params: list[nn.Parameter], max_norm: float | None) -> torch.Tensor | None:
    """Global gradient norm (clipping to max_norm when set); a device tensor, never synced here.
    ``params`` is listed once before training: walking the module tree for it every step cost about 5%
    of a small model's step (docs/BENCHMARKS.md, "Training throughput")."""
    if max_norm is None:
        return None
    with_grad = [p for p in params if p.grad is not None]
    norm = torch.nn.utils.get_total_norm([p.grad for p in with_grad], norm_type=2.0, foreach=True)
    if hasattr(norm, "full_tensor"):
        norm = norm.full_tensor()  # FSDP: per-shard partial norms reduced to the global norm
    torch.nn.utils.clip_grads_with_norm_(with_grad, max_norm, norm, foreach=True)
    return norm


def _due(count: int, every: int | None) -> bool:
    return every is not None and count % every == 0


def _local_numel(t: torch.Tensor) -> int:
    return t.to_local().numel() if hasattr(t, "to_local") else t.numel()


def shard_footprint(net: nn.Module, optimizer: torch.optim.Optimizer, rank: RankInfo) -> dict[str, list[int]]:
    """Elements of parameters and optimizer state each rank actually holds (FSDP: its shards); a collective."""
    params = sum(_local_numel(p) for p in net.parameters())
    optim = sum(_local_numel(v) for st in optimizer.state.values() for v in st.values() if torch.is_tensor(v) and v.ndim > 0)
    mine = torch.tensor([params, optim], dtype=torch.long, device=rank.device)
    every = [torch.zeros_like(mine) for _ in range(rank.world_size)]
    dist.all_gather(every, mine)
    return {"local_param_numel": [int(t[0]) for t in every], "local_optim_numel": [int(t[1]) for t in every]}


def _flops_per_sample(model: nn.Module, spec: JobSpec, info) -> float | None:
    """Training FLOPs per sample, where the model's SPEC knows them (gpt), for MFU."""
    known = model_spec(spec.model.name)
    if known is None or known.flops_per_sample is None:
        return None
    return known.flops_per_sample(model, full_args(spec.model.name, spec.model.args), info)


def run(spec: JobSpec, run_dir: Path, rank: RankInfo, data_dir: Path | None) -> int:
    """Train the job; returns the process exit code (0 done, PREEMPTED_EXIT_CODE after a SIGTERM)."""
    t = spec.train
    if t.precision == "fp16" and rank.device.type != "cuda":
        raise ValueError("train.precision: fp16 needs CUDA; use bf16 or fp32 on the CPU")
    phases = startup.current()
    events = EventWriter(run_dir, enabled=rank.is_main, sinks=sinks.build(run_dir, spec.visible_dump()) if rank.is_main else None)
    control_group = dist.new_group(backend="gloo") if rank.world_size > 1 else None
    stop = StopSignal(rank.world_size, control_group)
    events.status("starting", world_size=rank.world_size, strategy=spec.parallel.strategy, device=rank.device.type)

    compiled = compile_enabled(spec, rank.device)
    start_background_imports(compiled)
    torch.manual_seed(t.seed)  # identical init on every rank (FSDP shards what each rank built)
    phases.mark("events")
    splits = build_dataset(spec.data.name, spec.data.args, data_dir)
    phases.mark("data")
    model = build_model(spec.model.name, spec.model.args, splits.info)
    flops = _flops_per_sample(model, spec, splits.info)
    phases.mark("model")
    wrapped = parallelize(model, rank, spec, splits.info.task, mark=phases.mark)
    phases.mark("parallelize")
    net = wrapped.model
    pipe = wrapped.pipeline
    # Ranks that differ only in a pipeline or tensor-parallel coordinate read the same samples.
    data_rank = wrapped.data_rank or rank
    batches = TrainBatches(splits.train, data_rank, t.global_batch_size, t.grad_accum_steps, t.seed, spec.data.num_workers)
    total_steps = t.epochs * batches.steps_per_epoch
    if t.max_steps is not None:
        total_steps = min(total_steps, t.max_steps)
    # Fused AdamW/SGD: one kernel over every parameter. On the CPU too (torch >= 2.4): the step's optimizer time
    # falls about 3x on the benchmark's MLP, which is what closed the gap to a hand-written loop (docs/BENCHMARKS.md).
    # On the CPU only for plain DDP: pipeline and tensor-parallel stages keep the default kernels there.
    fused = wrapped.strategy == "ddp" and (rank.device.type == "cuda" or wrapped.data_rank is None)
    optimizer = build_optimizer(net, t, fused=fused)
    params = list(net.parameters())
    scheduler = build_scheduler(optimizer, t, total_steps)
    scaler = grad_scaler(wrapped, t.precision, rank.device)
    # Per data-parallel rank stream for dropout (tensor-parallel ranks must drop the same replicated activations);
    # restored exactly on resume.
    torch.manual_seed(t.seed + 1 + data_rank.rank)

    async_group = dist.new_group(backend="gloo") if spec.checkpoint.async_save else None
    checkpointer = Checkpointer(run_dir, spec, rank, events, {"name": spec.model.name, "args": spec.model.args},
                                splits.info, async_group)
    phases.mark("optimizer")
    pos = checkpointer.load_latest(net, optimizer, scheduler, scaler) or TrainPosition()
    phases.mark("checkpoint_load")
    resumed_from = pos.step
    tokens = splits.info.input_shape[0] if splits.info.task == "lm" else None
    # A sweep trial stops at its rung's step: max_steps stays the schedule's horizon, as in a straight run.
    pause = pause_step(os.environ.get(PAUSE_AT_ENV), batches.steps_per_epoch, total_steps)
    reporter = MetricsReporter(events, rank, t.log_every_steps, total_steps, t.global_batch_size, tokens, flops, pause)
    mesh = dict(zip(wrapped.mesh.mesh_dim_names, wrapped.mesh.shape, strict=True)) if wrapped.mesh is not None else None
    events.status("training", world_size=rank.world_size, total_steps=total_steps, steps_per_epoch=batches.steps_per_epoch,
                  resumed_from_step=resumed_from, mesh=mesh, startup=phases.as_dict())
    log.info("training steps %d..%d (epoch %d, step %d in epoch)", pos.step + 1, total_steps, pos.epoch, pos.step_in_epoch)

    autocast = (torch.autocast(rank.device.type, dtype=wrapped.autocast_dtype) if wrapped.autocast_dtype is not None
                else contextlib.nullcontext())
    task = splits.info.task
    # Compiled with the blocks: the fp32 cast of the logits and the cross-entropy become one kernel instead of
    # several passes over a (tokens x vocab) tensor, which at GPT-2's vocabulary is most of the step's memory traffic.
    train_loss = torch.compile(tasks.train_loss) if compiled and pipe is None else tasks.train_loss
    first_step = True
    is_ddp = hasattr(net, "no_sync")  # one rank is not wrapped in DDP (trainer/parallel.py)
    accum = t.grad_accum_steps
    preempted = False
    paused = pause is not None and pos.step >= pause  # resumed at its rung already: nothing to train
    net.train()
    profiler = StepProfiler(spec.profile, run_dir, rank)
    reporter.reset_window(pos.step)
    epoch_iter = batches.epoch(pos.epoch, pos.step_in_epoch) if pos.step < total_steps and not paused else iter(())
    # Every rank starts from the saved rank-average, so the all-reduced mean at the epoch's end is exact.
    epoch_loss = torch.tensor(pos.epoch_loss_sum, device=rank.device)
    while pos.step < total_steps and not paused:
        micro_batches = next(epoch_iter, None)
        if micro_batches is None:  # epoch exhausted (only reached on resume at an epoch boundary)
            pos.epoch, pos.step_in_epoch = pos.epoch + 1, 0
            epoch_iter = batches.epoch(pos.epoch)
            continue
        profiler.before(pos.step + 1)
        loss_sum = None
        if pipe is not None:  # the schedule runs forward and backward over its own micro-batches
            (x, y), = micro_batches
            with autocast:
                loss_sum = pipe.train_step(x, y)
        for i, (x, y) in enumerate(micro_batches if pipe is None else ()):
            # DDP: all-reduce gradients only on the last micro-batch of the step.
            sync = contextlib.nullcontext() if not is_ddp or i == accum - 1 else net.no_sync()
            with sync:
                with autocast:
                    out = net(x)
                loss = train_loss(task, out, y)
                if accum > 1:  # a division is an autograd node too: only where it changes the value
                    loss = loss / accum
                (scaler.scale(loss) if scaler is not None else loss).backward()
            loss_sum = loss.detach() if loss_sum is None else loss_sum + loss.detach()
        if first_step:
            phases.mark("first_forward_backward")  # with train.compile: where the blocks and the loss are compiled
        if scaler is not None:
            scaler.unscale_(optimizer)
        if wrapped.data_rank is not None:  # parameters split over stages or sharded over a 2-D mesh
            from trainer.model_parallel.norms import clip_grad_norm  # here: its imports (pipelining, DTensor) cost seconds

            parts = pipe.parts if pipe is not None else [net]
            grad_norm = clip_grad_norm(parts, t.grad_clip, pipe.group if pipe is not None else None)
        else:
            grad_norm = _grad_norm_and_clip(params, t.grad_clip)
        lr = optimizer.param_groups[0]["lr"]
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
        step_epoch = pos.epoch
        pos.step += 1
        pos.step_in_epoch += 1
        epoch_loss += loss_sum
        epoch_ended = pos.step_in_epoch == batches.steps_per_epoch
        if epoch_ended:
            pos.epoch, pos.step_in_epoch = pos.epoch + 1, 0
            if pos.step < total_steps:
                epoch_iter = batches.epoch(pos.epoch)

        if first_step:
            first_step = False
            phases.mark("first_optimizer_step")
            if rank.is_main:
                phases.log("to the first step")
        profiler.after(pos.step)
        faults.at_step(pos.step, rank.rank)
        if reporter.train_step(pos.step, step_epoch, loss_sum, grad_norm, lr) and reporter.agreed_step_time:
            stop.set_interval_from_step_time(reporter.agreed_step_time)
        if epoch_ended:
            reporter.epoch_loss(pos.step, step_epoch, epoch_loss, batches.steps_per_epoch)
            epoch_loss.zero_()
        last = pos.step == total_steps
        paused = pause is not None and pos.step >= pause
        busy = False
        # Evaluated at the rung's step: that is the value the sweep ranks the trial by.
        if splits.eval is not None and (last or paused or _due(pos.step, spec.eval.every_steps)
                                        or (epoch_ended and _due(pos.epoch, spec.eval.every_epochs))):
            evaluate(wrapped, splits.eval, rank, spec, task, autocast, events, pos.step, step_epoch)
            busy = True
        if paused:
            break  # the checkpoint below, then the pause
        if not last and stop.should_stop(pos.step):
            preempted = True
            break
        if not last and (checkpointer.due(pos.step) or (epoch_ended and _due(pos.epoch, spec.checkpoint.every_epochs))):
            pos.epoch_loss_sum = reporter.global_mean(epoch_loss)
            checkpointer.save(pos, step_epoch, net, optimizer, scheduler, scaler)
            busy = True
        checkpointer.poll()
        if busy:
            reporter.reset_window(pos.step)

    stop.close()
    profiler.close()
    footprint = shard_footprint(net, optimizer, rank)
    step_epoch = pos.epoch if pos.step_in_epoch else max(0, pos.epoch - 1)
    if pos.step > resumed_from or checkpointer.last_saved_step != pos.step:
        pos.epoch_loss_sum = reporter.global_mean(epoch_loss)
        checkpointer.save(pos, step_epoch, net, optimizer, scheduler, scaler, final=not (preempted or paused))
    checkpointer.wait()
    if preempted:
        log.warning("stopped by signal after step %d; checkpoint saved", pos.step)
        events.status("preempted", step=pos.step, epoch=step_epoch, **footprint)
        events.close()
        return PREEMPTED_EXIT_CODE
    if paused:
        # Exit 0: a non-zero exit would make torchrun restart the ranks; the worker reads the phase.
        log.info("paused at step %d, the rung its sweep allows; checkpoint saved", pos.step)
        events.status(PAUSED_PHASE, step=pos.step, epoch=step_epoch, total_steps=total_steps, **footprint)
        events.close()
        return 0
    events.status("done", step=pos.step, epoch=step_epoch, total_steps=total_steps, **footprint)
    events.close()
    return 0


@torch.no_grad()
def evaluate(wrapped: Parallelized, dataset, rank: RankInfo, spec: JobSpec, task: str, autocast, events: EventWriter,
             step: int, epoch: int) -> dict[str, float]:
    """Exact eval over all data-parallel ranks' shards: sums and counts all-reduced, then divided."""
    started = time.perf_counter()
    net = wrapped.model
    data_rank = wrapped.data_rank or rank
    modules = wrapped.pipeline.parts if wrapped.pipeline is not None else [net]
    for m in modules:
        m.eval()
    batch = spec.train.global_batch_size // data_rank.world_size
    sums = torch.zeros(3, device=rank.device, dtype=torch.float64)
    for x, y, valid in eval_batches(dataset, data_rank, batch, spec.eval.max_batches):
        with autocast:
            if wrapped.data_rank is None:
                out = net(x)
            else:
                from trainer.model_parallel.apply import eval_forward

                out = eval_forward(wrapped, x, spec)
        if out is not None:
            sums += tasks.eval_sums(task, out, y, valid).double()
    if rank.world_size > 1:
        dist.all_reduce(sums)
    for m in modules:
        reshard(m)
        m.train()
    metrics = tasks.eval_metrics(task, sums.cpu())
    if metrics:
        metrics["eval/time_s"] = time.perf_counter() - started
        events.metric(step, epoch, metrics)
    return metrics
