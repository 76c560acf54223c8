"""The decision core: the keep rule and margins (``rules``), the Ray Tune scheduler (``scheduler``:
Ray's hooks and when to decide) over its typed records, state and persistence, the early answer,
and the offline simulator."""
