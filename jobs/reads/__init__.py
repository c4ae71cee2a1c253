"""What the API reads, and nothing it writes: one job (``job_lookup``, ``job_read``), pages of jobs and metric
points (``job_pages``) with their cursors (``cursors``), the live event feed (``feed``), the files of a run
directory it serves (``artifacts``, ``job_logs`` and ``stored_logs``, ``weights_file``, ``checkpoint_archive``, ``workdir_files``),
usage (``usage``) and the numbers of ``/metrics`` (``job_stats``)."""
