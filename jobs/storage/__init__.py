"""An S3-compatible object store as the home of what a job leaves (TORCHYARD_STORAGE_URL): the URL (``url.py``), the
store itself over boto3 (``store.py``), which checkpoint in it is complete (``manifest.py``, pure) and checkpoints
uploaded and downloaded whole (``checkpoints.py``). Nothing here knows SQL, Redis or the worker."""
