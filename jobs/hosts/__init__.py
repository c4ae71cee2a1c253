"""The hosts: each worker's GPUs and CPU slots registered and heart-beaten in SQL, and who holds them
(``registry``); drains and GPU quarantines (``states``); which failures count against a GPU (``gpu_faults``)."""
