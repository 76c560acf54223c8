"""collapse-hpo: Ray Tune sweeps that stop losing trials early by predicted final loss."""

__version__ = "0.1.0"
