"""The collapse-residual monitor (paper §4): ``hpo monitor`` on any runs' curves (``command``) and
live in sweeps (``live``)."""
