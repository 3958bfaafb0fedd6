"""Steps that several workflows share, each a site handler and its server step.

* :mod:`.describe` — per-feature moments of a part and the pooled standardisation;
* :mod:`.evaluate` — a model's evaluation sums on a part and their pooling;
* :mod:`.params` — model parameters in a message;
* :mod:`.profile` — column profiles, the first exchange of a job;
* :mod:`.encoding` — federated one-hot encoding (agreed category lists);
* :mod:`.baselines` — the local-only baselines scored like the federated model.
"""
