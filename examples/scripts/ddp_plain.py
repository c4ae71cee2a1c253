"""A plain DDP script in the style of the PyTorch "multi-GPU training with torchrun" tutorial.

It uses nothing of torchyard: run it by hand or as a `kind: script` job, unchanged.

    torchrun --standalone --nproc-per-node=2 examples/scripts/ddp_plain.py 4 1

Under torchyard its output lands in the job's rank logs, its exit code decides the job's
status, and since it runs in the job's working directory (its copy of the code, kept across
attempts), `snapshot.pt` survives a retry and the retried attempt resumes from it.
"""

import argparse
import logging
import os

import torch
import torch.nn.functional as F
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

log = logging.getLogger("ddp_plain")


class MyTrainDataset(Dataset):
    """Seeded synthetic regression data: y = x @ w + noise."""

    def __init__(self, size: int, features: int = 20):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(size, features, generator=g)
        self.y = self.x @ torch.randn(features, 1, generator=g) + 0.01 * torch.randn(size, 1, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, index):
        return self.x[index], self.y[index]


def ddp_setup() -> torch.device:
    # NCCL on GPUs, gloo on the CPU; torchrun provides RANK, WORLD_SIZE and the rendezvous.
    if torch.cuda.is_available():
        local_rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local_rank)
        init_process_group(backend="nccl")
        return torch.device("cuda", local_rank)
    init_process_group(backend="gloo")
    return torch.device("cpu")


class Trainer:
    def __init__(self, model, train_data, optimizer, save_every, snapshot_path, device):
        self.global_rank = int(os.environ["RANK"])
        self.device = device
        self.model = model.to(device)
        self.train_data = train_data
        self.optimizer = optimizer
        self.save_every = save_every
        self.epochs_run = 0
        self.snapshot_path = snapshot_path
        if os.path.exists(snapshot_path):
            log.info("Loading snapshot")
            self._load_snapshot(snapshot_path)
        self.model = DDP(self.model, device_ids=[device.index] if device.type == "cuda" else None)

    def _load_snapshot(self, snapshot_path):
        snapshot = torch.load(snapshot_path, map_location=self.device)
        self.model.load_state_dict(snapshot["MODEL_STATE"])
        self.epochs_run = snapshot["EPOCHS_RUN"]
        log.info("Resuming training from snapshot at Epoch %d", self.epochs_run)

    def _run_batch(self, source, targets):
        self.optimizer.zero_grad()
        output = self.model(source)
        loss = F.mse_loss(output, targets)
        loss.backward()
        self.optimizer.step()
        return loss.item()

    def _run_epoch(self, epoch):
        b_sz = len(next(iter(self.train_data))[0])
        self.train_data.sampler.set_epoch(epoch)
        total = 0.0
        for source, targets in self.train_data:
            total += self._run_batch(source.to(self.device), targets.to(self.device))
        log.info("[rank %d] Epoch %d | Batchsize: %d | Steps: %d | loss %.4f",
                 self.global_rank, epoch, b_sz, len(self.train_data), total / len(self.train_data))

    def _save_snapshot(self, epoch):
        snapshot = {"MODEL_STATE": self.model.module.state_dict(), "EPOCHS_RUN": epoch + 1}
        # Write then rename, so a crash mid-save never leaves a half-written snapshot behind.
        torch.save(snapshot, self.snapshot_path + ".tmp")
        os.replace(self.snapshot_path + ".tmp", self.snapshot_path)
        log.info("Epoch %d | Training snapshot saved at %s", epoch, self.snapshot_path)

    def train(self, max_epochs: int):
        for epoch in range(self.epochs_run, max_epochs):
            self._run_epoch(epoch)
            if self.global_rank == 0 and epoch % self.save_every == 0:
                self._save_snapshot(epoch)


def load_train_objs():
    train_set = MyTrainDataset(512)  # load your dataset
    model = torch.nn.Linear(20, 1)  # load your model
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    return train_set, model, optimizer


def prepare_dataloader(dataset: Dataset, batch_size: int):
    return DataLoader(dataset, batch_size=batch_size, pin_memory=torch.cuda.is_available(), shuffle=False,
                      sampler=DistributedSampler(dataset))


def main(save_every: int, total_epochs: int, batch_size: int, snapshot_path: str = "snapshot.pt"):
    device = ddp_setup()
    dataset, model, optimizer = load_train_objs()
    train_data = prepare_dataloader(dataset, batch_size)
    trainer = Trainer(model, train_data, optimizer, save_every, snapshot_path, device)
    trainer.train(total_epochs)
    destroy_process_group()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser(description="simple distributed training job")
    parser.add_argument("total_epochs", type=int, help="Total epochs to train the model")
    parser.add_argument("save_every", type=int, help="How often to save a snapshot")
    parser.add_argument("--batch_size", default=32, type=int, help="Input batch size on each device (default: 32)")
    args = parser.parse_args()

    main(args.save_every, args.total_epochs, args.batch_size)
