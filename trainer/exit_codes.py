"""Exit codes the worker reads from a finished trainer. Torch-free so the worker can import it."""

# Every rank exits with this code after a SIGTERM led to a saved checkpoint: "preempted, requeue
# and resume". 75 is EX_TEMPFAIL in sysexits.h; it differs from 143 (128 + SIGTERM), which is what
# a rank killed by SIGTERM before it could save would report.
PREEMPTED_EXIT_CODE = 75

# The spec could not be loaded or checked (a bad file, a path outside the data root, ...).
SPEC_ERROR_EXIT_CODE = 2
