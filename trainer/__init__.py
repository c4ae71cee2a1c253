"""What torchrun runs: the training loop and what it builds. Knows nothing of HTTP, SQL or Redis."""
