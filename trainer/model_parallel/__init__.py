"""Model parallelism for catalog models: pipeline (``parallel.pipeline``) and tensor (``parallel.tensor``)
parallelism, each on a 2-D device mesh with data parallelism over the remaining ranks, in the style of
torchtitan: the model is built whole on every rank, then cut (pipeline) or sharded (tensor) in place, so
parameter names, hence checkpoints, stay those of the whole model.

* ``mesh.py``: the dp x pp / dp x tp mesh, and the data-parallel coordinate the loader shards by.
* ``pipeline.py``: stages from a gpt or mlp, a torch.distributed.pipelining schedule, forward-only eval.
* ``tensor.py``: ``parallelize_module`` plans for gpt (column-wise q/k/v and fc, row-wise projections).
* ``norms.py``: the global gradient norm over stages and shards.
"""
