"""The site side of the protocol: one organisation's table and what answers a request.

* :mod:`.core` — :class:`~.core.Site`, the handler registry (``@handler``, ``@table_step``) and
  the dispatch that runs the privacy gate around every handler;
* :mod:`.lazy` — :class:`~.lazy.LazySite`, a site whose table is read only when a request needs it;
* :mod:`.data` — helpers that turn a site's table slice into model-ready arrays;
* :mod:`.parts` — the site's fixed row parts (a laminar family the site draws once);
* :mod:`.observed` — which cells the site measured (the evidence its ballots may use);
* :mod:`.secure` — the site's answers to secure aggregation's own exchanges.

Nothing here imports a workflow: a workflow module registers its handlers when a site first
sees one of its kinds (:func:`~.core.find_handler`, from :mod:`fedtab.federation.protocol.kinds`).
"""
