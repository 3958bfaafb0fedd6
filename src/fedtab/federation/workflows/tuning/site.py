"""Freedom-degree tuning's site side: a ballot over the site's fixed ``fit`` part."""

from __future__ import annotations



from fedtab.federation.workflows.election.site import ballot_reply
from fedtab.federation.protocol.messages import Message
from fedtab.federation.site.observed import measured_frame
from fedtab.federation.site.core import Site
from fedtab.federation.site.registry import handler
from fedtab.federation.site.matrices import part_rows




__all__ = []

@handler("ballot_fit")
def _ballot_fit(site: Site, request: Message) -> Message:
    rows = part_rows(site, "fit")
    return ballot_reply(site, "ballot_fit", request.meta.get("selector"), measured_frame(site, rows[site.feature_names], "fit"),
                        rows[site.target].to_numpy())
