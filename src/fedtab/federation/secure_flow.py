"""Site handlers of secure aggregation's own exchanges (``fedtab.privacy.secagg``).

``"secagg_keys"`` starts a session (a fresh X25519 key pair; the reply is the public
key) and ``"secagg_unmask"`` answers the unmasking round. The masking itself is not an
exchange of its own: any request that carries ``meta["secagg"]`` has its reply masked
by :meth:`~fedtab.federation.site.Site.handle` after the handler ran.
"""

from __future__ import annotations

import numpy as np

from ..privacy.secagg import new_session, unmask_reply
from .messages import Message
from ..privacy.gate import TEXT, Releases
from .site import Site, handler

__all__: list[str] = []


@handler("secagg_keys", Releases(part=None, keys=("pk",)))
def _keys(site: Site, request: Message) -> Message:
    session = request.meta.get("session")
    if not isinstance(session, str) or not session:
        raise ValueError("secagg_keys needs a session id")
    return Message("secagg_keys", {"pk": np.frombuffer(new_session(site, session), dtype=np.uint8)})


@handler("secagg_unmask", Releases(part=None, keys=("b_shares", "seeds"), meta={"label": TEXT}))
def _unmask(site: Site, request: Message) -> Message:
    return unmask_reply(site, request)
