// Written by `python -m dashboard.metric_names` from torchyard/client/metric_names.py, the mapping's one home: edit it there.
// Which logged metric a column shows as the job's loss and eval loss; the metrics keep their logged names.
export const DISPLAY = {
  "train/loss": [
    "train/loss",
    "train_loss_step",
    "train_loss",
    "loss"
  ],
  "eval/loss": [
    "eval/loss",
    "val_loss",
    "eval_loss",
    "val/loss"
  ]
};

export function shown(values, column) {
  if (!values) return undefined;
  for (const name of DISPLAY[column] ?? [column]) {
    if (values[name] !== undefined && values[name] !== null) return values[name];
  }
  return undefined;
}
