"""Exceptions shared by every layer (no imports, so the algorithms may raise them too)."""

from __future__ import annotations

__all__ = ["SiteFault"]


class SiteFault(ValueError):
    """An error whose text a site may send to the server.

    A site's handlers raise it for a request it cannot answer, with a message built by
    fedtab from column names, row counts and the request's own fields — never from a cell
    value. Any other exception raised while a site answers is reported to the server by
    its type only (the text stays in the site's log), because an arbitrary message may
    quote the site's data (issue 20: an error listing "values outside the list" sent 30
    exact incomes in 6 requests). The release gate also replaces any quoted token of a
    ``SiteFault`` text that is not a public name (a column, a label, a part) by ``'…'``.
    """
