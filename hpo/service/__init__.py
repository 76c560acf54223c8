"""The service: the ``hpo`` command line, the sweep driver, and sweeps as Ray Jobs."""
