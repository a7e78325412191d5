"""cfmaps HTTP service: a thin FastAPI layer over :mod:`maps_core`.

Create the app with :func:`app.main.create_app`.
"""
