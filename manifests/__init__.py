"""Launch files for running a torchyard JobSpec on an existing engine: Kubernetes (a torchrun
Job or a Kubeflow PyTorchJob) and Slurm (sbatch + srun + torchrun). See docs/deploy.md."""
