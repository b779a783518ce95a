"""The JSON vocabulary of the REST API, shared by the service (which answers with these models)
and the clients (which parse the answers into them): one definition of every body's fields,
aliases and limits, and of the protocol's header names (:mod:`.headers`). Pydantic only, no
torch: it imports in the service image (docs/api.md)."""
