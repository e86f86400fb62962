"""What the engine tells Prometheus and the dashboard: each actor's figures (``report.py``),
the names they go by (``families.py``) and the view that gathers them (``collector.py``)."""
