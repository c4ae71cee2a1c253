"""The job domain shared by api/ and worker/: what is stored and how it changes (``store``), who runs where
(``scheduling``), the hosts (``hosts``), a job's life outside a scheduling pass (``lifecycle``), what the API reads
(``reads``), code bundles (``code_bundles``), sweeps (``sweeps``), webhooks (``webhooks``) and the plumbing under all of
them (``infra``); every setting in ``settings``. The job itself, its spec, is jobspec's."""
