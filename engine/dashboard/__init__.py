"""The web dashboard, served by the monitor actor (``engine/actors/monitor.py``): one page
without a build step (``static/``) and the JSON it reads (``api.py``, ``server.py``)."""
