"""Where a sweep's records live: its MLflow runs (``runs``), tracking URIs (``uri``), and the
checked connections to a Ray head and an MLflow server (``cluster``)."""
