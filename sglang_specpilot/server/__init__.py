"""OpenAI-compatible HTTP server over the engine (``specpilot serve``; needs the ``server`` extra).

app.py (routes) -> bridge.py (asyncio side of a job) -> scheduler.py (engine thread, continuous batching
via engine/rows.py); protocol.py / prompts.py / responses.py shape requests and replies; errors.py makes
every failure an OpenAI-style JSON error; metrics.py renders Prometheus text.
"""
