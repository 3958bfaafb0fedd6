"""The workflows: each a package with its site handlers, its server steps and its server loop.

* :mod:`.election` — Feature Election (ballots, the elected mask);
* :mod:`.training` — FedAvg (or a model's exact aggregation) on the elected columns;
* :mod:`.gbdt` — federated histogram gradient boosting;
* :mod:`.imputation` — FedHF-Impute;
* :mod:`.selection` — honest model selection by federated cross-validation;
* :mod:`.score_test` — pooled forward selection by score tests;
* :mod:`.pooled_anova` — the pooled ANOVA selector from per-class sums;
* :mod:`.tuning` — freedom-degree tuning.

A workflow imports the protocol (:mod:`fedtab.federation.protocol`), the site side
(:mod:`fedtab.federation.site.core`) and the shared steps (:mod:`fedtab.federation.steps`); never the
other way round.
"""
