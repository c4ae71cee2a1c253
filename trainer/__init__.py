"""What torchrun runs: the training engine. Knows nothing of HTTP, SQL or Redis."""
