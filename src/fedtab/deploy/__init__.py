"""Deployment material for a consortium: TLS certificates, site keys, FLARE projects.

* :mod:`fedtab.deploy.keys` — a CA, the SuperLink's TLS certificate and one SuperNode
  authentication key pair per site (``cryptography``), written as the files Flower 1.42
  reads, plus the ``site -> public key`` map that binds a site's name to its key.
* :mod:`fedtab.deploy.flare_project` — the ``project.yml`` that ``nvflare provision``
  turns into startup kits for the consortium's sites.

Nothing here imports Flower or FLARE.
"""
