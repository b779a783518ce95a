"""The aggregation service.

Entry points: ``service.settings.ServiceSettings`` (configuration, ``GLASU_*``),
``service.app.create_app(settings)`` (the FastAPI app factory) and
``service.server.serve(settings)`` (uvicorn, used by ``glasu serve``). See docs/protocol.md.
"""
