"""A job's life outside a scheduling pass: submitted or retried (``submission``), cancelled or deleted by its owner
(``job_control``), put back in line when its worker or host is lost (``reconciler``), its run directory expired
(``retention``)."""
