"""What keeps one job's processes and files apart from the service and from other jobs, and ends all of them.

Each attempt runs as a uid of its own where the worker may switch uids (``job_users``: which uid, how a child
becomes it, how every process of it ends; ``uid_leases``: the uid leased in SQL across workers), in a cgroup of
its own where the host lets it write one (``cgroups``), with a run directory it owns and nothing else of the
service within reach (``run_dirs``). ``isolation`` is what the supervisor calls at an attempt's start and end;
``processes`` owns the attempt's process tree (start in its own session, stop, kill what is left); ``leftovers``
ends what earlier attempts left running on a worker that runs jobs as its own user. Not a container: no
namespaces, no seccomp, no resource limits ([security.md](../../docs/security.md) has what it does not stop).
"""
