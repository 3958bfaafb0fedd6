"""Site handlers of secure aggregation's own exchanges (``fedtab.privacy.secagg``).

``"secagg_keys"`` starts a session (a fresh X25519 key pair signed with the site's
identity key; refused by a site without a verified consortium key list),
``"secagg_sign"`` is the consistency round (the site signs the survivor list it was
told, once per sum) and ``"secagg_unmask"`` answers the unmasking round (only for the
list it signed, when enough survivors signed it too). The masking itself is not an
exchange of its own: any request that carries ``meta["secagg"]`` is checked by the
site's policy before its handler runs and has its reply masked by
:meth:`~fedtab.federation.site.core.Site.handle` after.
"""

from __future__ import annotations

from fedtab.privacy.secagg import new_session, refused, sign_survivors, unmask_reply
from fedtab.federation.protocol.messages import Message
from fedtab.federation.site.core import Site
from fedtab.federation.site.registry import handler

__all__: list[str] = []


@handler("secagg_keys")
@refused
def _keys(site: Site, request: Message) -> Message:
    session = request.meta.get("session")
    if not isinstance(session, str) or not session or len(session) > 128:
        raise ValueError("secagg_keys needs a session id")
    return Message("secagg_keys", new_session(site, session))


@handler("secagg_sign")
def _sign(site: Site, request: Message) -> Message:
    return sign_survivors(site, request)


@handler("secagg_unmask")
def _unmask(site: Site, request: Message) -> Message:
    return unmask_reply(site, request)
