"""Private entity alignment: the service's side of the ring PSI (docs/protocol.md,
"Alignment").

- :mod:`.manager`: :class:`AlignmentManager`, creating alignments and relaying the parties'
  blinded sets, then intersecting them;
- :mod:`.tables`: the alignments' tables in the service's database.

The wire models are ``secure/wire/alignment.py``; the routes ``service/api/routes/
alignment.py``.
"""

from service.alignment.manager import AlignmentManager

__all__ = ["AlignmentManager"]
