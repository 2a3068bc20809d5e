"""`gpuyantra dashboard`: a live page of campaigns, served speed, swapped-in kernels and the skill library.

    app = create_app(Settings(server_url="http://127.0.0.1:8000", temporal_address="localhost:7233"))

`sources.py` fetches (background loops, one status line per source), `metrics.py` turns /metrics
text into samples and charts, `skills.py` searches the library, `app.py` serves the JSON and
checks the token, `page.py` is the page. Imports neither torch nor triton.
"""

from gpuyantra.dashboard.app import create_app, is_loopback
from gpuyantra.dashboard.sources import Settings, Sources

__all__ = ["Settings", "Sources", "create_app", "is_loopback"]
