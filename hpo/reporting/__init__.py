"""Reporting: the sweep's analysis (predicted-best against current-best), its plots and report, and
live progress."""
