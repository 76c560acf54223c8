"""Foundations every part of the service uses: the one error type and its exit status, table
rendering, ``--set`` overrides and safe names, the output folder's lock."""
