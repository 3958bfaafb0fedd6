"""The protocol's errors: each names the site(s) at fault, and only those."""

from __future__ import annotations

from typing import Mapping

__all__ = ["FederationError", "SiteError", "SiteRefused", "QuorumError", "reject_text"]


class FederationError(RuntimeError):
    """A federated step could not complete; the message names the site(s) at fault."""


class SiteError(FederationError):
    """One or more named sites failed or sent a reply that was rejected.

    Attributes:
        sites: ``{site: reason}`` of exactly the sites at fault (never an honest one).
    """

    def __init__(self, message: str, sites: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.sites = dict(sites or {})


class SiteRefused(SiteError):
    """One or more sites refused a request under their disclosure policy.

    Attributes:
        refusals: ``{site: reason}`` as the sites gave them (also ``sites``).
    """

    def __init__(self, text: str, refusals: Mapping[str, str]) -> None:
        super().__init__(text, refusals)
        self.refusals = dict(refusals)


class QuorumError(FederationError):
    """Fewer sites than the quorum (``min_sites``) are left to continue the run."""


def reject_text(site: str, reason: str) -> str:
    """The one wording of a rejected reply: ``site 'x': reason``."""
    return f"site {site!r}: {reason}"
