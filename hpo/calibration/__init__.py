"""Calibration: reference curves trained into a bank (``banking``) or imported (``curve_import``),
the fit of each mode (``fit``), its held-out errors, size choice and ranking error, and its
report; ``calibrate`` is the command."""
