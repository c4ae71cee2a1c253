"""Loss and eval statistics per task (classification, regression, language modelling)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def train_loss(task: str, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean loss of a micro-batch, computed in fp32 whatever the autocast dtype."""
    out = out.float()
    if task == "regression":
        return F.mse_loss(out, y.float().view_as(out))
    # A reshape is an autograd node: only where the shapes need one (a language model's (batch, seq, vocab)).
    if out.ndim != 2:
        out = out.reshape(-1, out.shape[-1])
    return F.cross_entropy(out, y if y.ndim == 1 else y.reshape(-1))


def eval_sums(task: str, out: torch.Tensor, y: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """[loss sum, count, correct] of a batch, padding excluded; summed over batches and ranks for exact means."""
    out = out.float()
    w = valid.to(out.dtype)
    if task == "regression":
        per = F.mse_loss(out, y.float().view_as(out), reduction="none").flatten(1).mean(1)
        return torch.stack([(per * w).sum(), w.sum(), torch.zeros((), device=out.device)])
    if task == "lm":
        per_tok = F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1), reduction="none").view(y.shape)
        wt = w[:, None].expand_as(per_tok)
        correct = ((out.argmax(-1) == y).to(out.dtype) * wt).sum()
        return torch.stack([(per_tok * wt).sum(), wt.sum(), correct])
    per = F.cross_entropy(out, y, reduction="none")
    correct = ((out.argmax(-1) == y).to(out.dtype) * w).sum()
    return torch.stack([(per * w).sum(), w.sum(), correct])


def eval_metrics(task: str, sums: torch.Tensor) -> dict[str, float]:
    loss_sum, count, correct = (float(v) for v in sums.tolist())
    if count == 0:
        return {}
    metrics = {"eval/loss": loss_sum / count}
    if task == "classification":
        metrics["eval/accuracy"] = correct / count
    elif task == "lm":
        metrics["eval/token_accuracy"] = correct / count
        metrics["eval/perplexity"] = float(torch.tensor(loss_sum / count).exp())
    return metrics
