"""The job contract: what a job is, and how the worker and a job's ranks meet. Torch-free, and nothing of trainer/.

The API checks a submitted spec with it, the scheduler and the worker read the stored one, and the trainer loads
the same file inside the ranks; none of them has another definition of a job. ``spec`` is the one definition
(catalog and script kinds), its cross-field and host rules in ``rules``, their messages in the user's words in
``messages``, what is read back of a stored spec in ``view``; the catalog's models and datasets as argument
schemas in ``catalog`` (their torch-side builders are trainer.models and trainer.data), path safety in ``paths``,
the names a job's ``env`` may set in ``env_rules``, its ``requirements`` in ``requirements``, the resume arguments'
template in ``resume_args``. Between the worker and the ranks: the ``torchrun`` command line
(``torchrun_args``), the exit codes that carry a verdict (``exit_codes``), the parent-death signal every
process of a job and of the service is started with (``pdeathsig``), and the files the ranks leave in their
attempt's log directory as the API and the worker read them (``rank_logs``).
"""
