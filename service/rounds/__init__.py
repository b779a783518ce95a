"""The pass/round state machine of a session, independent of HTTP.

Per pass and aggregation layer l, clients upload node sets (l below the top layer L, training
passes only; the service forms the sorted union once all M arrived) and then embedding shares in
parts of at most ``secure.protocol.PART_VALUES`` values (each part validated once and added into
the running sum of its (layer, part) as it arrives; the M-th completes the part's sum). The pass
advances when every part of its last aggregation layer is summed. With DP on, storing the first
aggregation layer's sum of a pass is its release: the ledger row and the sum's row are written
in one durable transaction (on disk before ``COMMIT`` returns, the sum's file synced before), and
nothing of the pass is served before.

Every method is blocking (SQLite, CKKS); call them from a worker thread. Refusals are
:mod:`service.domain_errors`; the app turns them into problem details.

- :mod:`.engine`: :class:`RoundEngine`, the facade the routes and the session manager use;
- :mod:`.services`: what every component works with (store, plans, aggregators, telemetry,
  bodies);
- :mod:`service.session_state`: the state machine, pure: which slot closes, who is left out
  and where they rejoin, what a release does, where a session goes once a pass completed;
- :mod:`.slots`: the store's side of it (who uploaded, who is in the pass, a layer's rows and
  parts), read for it, and the absences it decides, written;
- :mod:`.gate`: the checks shared by every route (session, pass, layer, current pass);
- :mod:`.uploads`: accepting node sets (and forming their union), shares and metrics;
- :mod:`.sums`: running sums (per part of a layer), recording the release in the ledger,
  advancing the pass (:mod:`.recent_sums`: the latest sums kept in memory);
- :mod:`.payload_store`: where share and sum bodies live (:mod:`.payload_files`: files beside
  an SQLite database; a table of a PostgreSQL one);
- :mod:`.downloads`: the pass descriptor, unions and sums for the clients;
- :mod:`.types`: the values crossing the engine's boundary.
"""

from service.rounds.engine import RoundEngine
from service.rounds.types import Caller, Payload, UploadOutcome

__all__ = ["Caller", "Payload", "RoundEngine", "UploadOutcome"]
