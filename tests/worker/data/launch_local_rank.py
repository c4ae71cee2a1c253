"""A training script written for ``python -m torch.distributed.launch``, as many on GitHub still are: its rank
comes from ``--local_rank``, whose default (-1) means "not distributed"."""

import argparse

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int, default=-1)
parser.add_argument("--epochs", type=int, default=2)
args = parser.parse_args()
if args.local_rank != -1:
    dist.init_process_group(backend="gloo")
world = dist.get_world_size() if dist.is_initialized() else 1

torch.manual_seed(0)
x = torch.randn(256, 8)
data = TensorDataset(x, x @ torch.randn(8, 1))
sampler = DistributedSampler(data) if world > 1 else None
loader = DataLoader(data, batch_size=32, sampler=sampler, shuffle=sampler is None)
model = torch.nn.Linear(8, 1)
if world > 1:
    model = DistributedDataParallel(model)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
for epoch in range(args.epochs):
    if sampler is not None:
        sampler.set_epoch(epoch)
    for xb, yb in loader:
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        loss.backward()
        optimizer.step()
    print(f"local_rank {args.local_rank} of world {world} epoch {epoch} loss {loss.item():.4f}")  # noqa: T201 - the script's own progress line
if dist.is_initialized():
    dist.destroy_process_group()
