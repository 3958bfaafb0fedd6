"""The model file's shape checks: a table of checkers run in order over the manifest and its arrays.

Each entry of :data:`CHECKS` is either a :class:`Rule` (a predicate over the manifest and the
one-line message when it fails) or a checker function that builds something the later entries
read (the model, its parameter shapes). An entry may rely on every entry before it; the first
that fails raises, through ``fail``, the :class:`~fedtab.job.model_file.ModelFileError` that
names the file. What is checked is listed in :mod:`fedtab.job.model_file`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, NoReturn, Union

import numpy as np

from .format import SPEC_FACTOR, SPEC_SLACK, STANDARDISE, ModelFileError, gbdt_model, number, strings

__all__ = ["CHECKS", "Manifest", "Rule", "check_imputer_weights", "check_manifest"]

Fail = Callable[[str], NoReturn]


@dataclass
class Manifest:
    """A manifest under check: its JSON ``m``, its arrays, how to fail, and what the checkers learn."""

    m: dict[str, Any]
    arrays: dict[str, np.ndarray]
    fail: Fail
    #: the model built from the manifest's spec (set by :func:`_model`)
    model: Any = None
    #: ``{parameter: shape}`` a model of this spec has over the features and classes
    template: dict[str, tuple] = field(default_factory=dict)

    @property
    def d(self) -> int:
        return len(self.m["features"])

    @property
    def c(self) -> int:
        return len(self.m["classes"])

    @property
    def imputer(self) -> dict[str, Any] | None:
        return self.m.get("imputer")

    def prefixed(self, prefix: str) -> dict[str, np.ndarray]:
        """The arrays under ``prefix`` by their name after it."""
        return {k[len(prefix):]: a for k, a in self.arrays.items() if k.startswith(prefix)}


@dataclass(frozen=True)
class Rule:
    """One check: ``ok(x)`` must hold, else ``message`` (text, or text made from the manifest)."""

    ok: Callable[[Manifest], bool]
    message: str | Callable[[Manifest], str]
    #: only checked when this holds (e.g. the file has an imputer)
    when: Callable[[Manifest], bool] = lambda x: True

    def __call__(self, x: Manifest) -> None:
        if self.when(x) and not self.ok(x):
            x.fail(self.message if isinstance(self.message, str) else self.message(x))


Check = Union[Rule, Callable[[Manifest], None]]


# ----------------------------------------------------------------------------- predicates
def _unique_names(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(f, str) for f in v) and len(set(v)) == len(v)


def _category_lists(cats: Any) -> bool:
    return isinstance(cats, dict) and all(isinstance(k, str) and strings(v) for k, v in cats.items())


def _provenance(m: Mapping[str, Any]) -> bool:
    prov = m.get("provenance", {})
    job = prov.get("job", {}) if isinstance(prov, dict) else None
    return isinstance(prov, dict) and isinstance(job, dict) and (
        "na_values" not in job or job["na_values"] is None or strings(job["na_values"]))


def _regression_spec(spec: Any) -> bool:
    """Whether a model file's ``{"name", "params"}`` predicts a number (``linear``, or ``gbdt`` with
    ``objective = "regression"``): such a file holds no classes."""
    if not isinstance(spec, dict):
        return False
    return spec.get("name") == "linear" or (spec.get("name") == "gbdt"
                                            and (spec.get("params") or {}).get("objective") == "regression")


def _is_gbdt(x: Manifest) -> bool:
    return isinstance(x.m["model"], dict) and x.m["model"].get("name") == "gbdt"


def _has_imputer(x: Manifest) -> bool:
    return x.imputer is not None


def _imputer_size(x: Manifest) -> int:
    return len(x.imputer["columns"])


def _edges(x: Manifest) -> np.ndarray:
    return x.arrays["imputer/edge_index"]


# ----------------------------------------------------------------------------- checkers that build
def _model(x: Manifest) -> None:
    """The model the spec builds -- a ``gbdt`` one with its trees validated as a whole (shapes,
    children, features); any other after its estimated size was checked against the file's arrays."""
    from ...learn.models import make_model, model_cost

    spec = x.m["model"]
    try:
        if _is_gbdt(x):
            x.model = make_model(spec)
            gbdt_model(x.m, x.arrays)
        else:
            held = sum(a.size for a in x.prefixed("model/").values())
            size = model_cost(spec, x.d, x.c).size
            if not size <= SPEC_FACTOR * held + SPEC_SLACK:
                x.fail(f"model: the spec needs ~{size:.2g} parameters, the file holds {held}")
            x.model = make_model(spec)
    except ModelFileError:
        raise
    except (ValueError, TypeError, KeyError, OverflowError) as exc:
        if isinstance(exc, KeyError) and not _is_gbdt(x):
            raise
        x.fail(f"model: {exc}")
    x.template = {k: tuple(v.shape) for k, v in x.model.init(x.d, x.c).items()}


def _personal_shapes(mode: str, template: Mapping[str, tuple]) -> dict[str, tuple]:
    """The arrays (name -> shape) one site's personalisation of ``mode`` holds."""
    k = template["intercept"]
    if mode == "none":
        return {}
    if mode == "intercept":
        return {"shift": k}
    if mode == "calibration":
        return {"scale": (1,), "shift": k}
    return {"coef": template["coef"], "intercept": k}  # finetune:<mu>, local


def _personalisation(x: Manifest) -> None:
    """The per-site models of a selection: mode, site names and each site's arrays."""
    from ...learn.personalise import check_mode

    got = {k for k in x.arrays if k.startswith("personal/")}
    pers = x.m.get("personalisation")
    if pers is None:
        if got:
            x.fail(f"arrays {sorted(got)[:3]} without a personalisation")
        return
    if not isinstance(pers, dict) or set(pers) != {"mode", "sites"} or not strings(pers["sites"]) \
            or len(set(pers["sites"])) != len(pers["sites"]):
        x.fail("personalisation must be {mode, sites} with a list of unique site names")
    try:
        mode = check_mode(pers["mode"])
    except ValueError as exc:
        x.fail(f"personalisation: {exc}")
    if mode != "none" and x.model.name != "logistic":
        x.fail(f"personalisation {mode!r} needs a logistic model, not {x.model.name!r}")
    shapes = _personal_shapes(mode, x.template)
    expected = {f"personal/{i}/{k}": shape for i in range(len(pers["sites"])) for k, shape in shapes.items()}
    if got != set(expected):
        x.fail(f"personalisation {mode!r} of {len(pers['sites'])} sites needs arrays {sorted(expected)[:4]}, "
               f"the file holds {sorted(got)[:4]}")
    for k, shape in expected.items():
        if x.arrays[k].shape != shape or x.arrays[k].dtype.kind != "f":
            x.fail(f"{k} holds {x.arrays[k].dtype} {x.arrays[k].shape}, expected float {shape}")


def _imputer_vectors(x: Manifest) -> None:
    f = _imputer_size(x)
    for k in ("mean", "std", "low", "high", "integer"):
        a = x.arrays[f"imputer/{k}"]
        if a.shape != (f,):
            x.fail(f"imputer/{k} has shape {a.shape}, expected ({f},)")


def _imputer_network(x: Manifest) -> None:
    """The imputer's network config within what its weights can hold. Its weights' names and
    shapes against the network are checked when the imputer is first needed
    (:func:`check_imputer_weights`), which a table without missing cells never needs."""
    im, f = x.imputer, _imputer_size(x)
    cfg = im.get("model_config")
    if not isinstance(cfg, dict) or cfg.get("n_features") != f:
        x.fail(f"imputer model_config must be an object with n_features = {f}")
    hidden, layers, rank = cfg.get("hidden_dim", 64), cfg.get("n_layers", 3), cfg.get("prior_rank", 0)
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (hidden, layers, rank)) \
            or hidden < 1 or rank > f:
        x.fail("imputer model_config: hidden_dim, n_layers and prior_rank must be integers in range")
    held = sum(a.size for a in x.prefixed("imputer/w/").values())
    need = f * hidden + layers * 4.0 * hidden * (hidden + 1)  # the embedding and each layer's four linear maps
    if not need <= SPEC_FACTOR * held + SPEC_SLACK:
        x.fail(f"imputer: its network needs ~{need:.2g} weights, the file holds {held}")
    if rank > 0 and not ({"imputer/prior_W", "imputer/prior_psi"} <= set(x.arrays)
                         and x.arrays["imputer/prior_W"].shape == (f, rank)
                         and x.arrays["imputer/prior_psi"].shape == (f,)):
        x.fail(f"imputer: a prior of rank {rank} needs imputer/prior_W ({f}, {rank}) and imputer/prior_psi ({f},)")


def _levels(x: Manifest) -> bool:
    cols, levels = set(x.imputer["columns"]), x.imputer.get("levels", {})
    return isinstance(levels, dict) and all(k in cols and isinstance(v, list) and v and all(map(number, v))
                                            for k, v in levels.items())


def _groups(x: Manifest) -> bool:
    cols, groups = set(x.imputer["columns"]), x.imputer.get("groups", [])
    return isinstance(groups, list) and all(strings(g) and len(g) > 1 and len(set(g)) == len(g) and set(g) <= cols
                                            for g in groups)


def _disjoint_groups(x: Manifest) -> bool:
    flat = [c for g in x.imputer.get("groups", []) for c in g]
    return len(set(flat)) == len(flat)


def _with_imputer(check: Callable[[Manifest], None]) -> Callable[[Manifest], None]:
    """``check``, run only on a file with an imputer."""
    def run(x: Manifest) -> None:
        if _has_imputer(x):
            check(x)

    run.__name__ = check.__name__
    return run


#: the checks of a manifest and its arrays, in order (each may rely on the ones before it)
CHECKS: tuple[Check, ...] = (
    Rule(lambda x: _unique_names(x.m["features"]), "features must be a non-empty list of unique names"),
    Rule(lambda x: x.m["classes"] != [] or _regression_spec(x.m["model"]),
         "classes must be a list of at least two labels (no classes: a regression model, linear or gbdt with "
         "objective = \"regression\")"),
    Rule(lambda x: isinstance(x.m["classes"], list) and (not x.m["classes"] or len(x.m["classes"]) >= 2)
         and all(isinstance(c, str) for c in x.m["classes"]), "classes must be a list of at least two labels"),
    *(Rule(lambda x, k=k: x.arrays[k].shape == (x.d,),
           lambda x, k=k: f"{k} has shape {x.arrays[k].shape}, expected ({x.d},) for {x.d} features")
      for k in STANDARDISE),
    Rule(lambda x: bool((x.arrays["standardise/std"] > 0).all()), "standardise/std must be positive"),
    # the manifest's JSON parts: the types every later step relies on
    Rule(lambda x: isinstance(x.m["schema"], dict) and strings(x.m["schema"].get("columns")),
         "schema must hold the column list (a list of names)"),
    Rule(lambda x: _category_lists(x.m["schema"].get("categories", {})),
         "schema categories must map column names to lists of category names"),
    Rule(lambda x: strings(x.m["encoded_columns"]), "encoded_columns must be a list of names"),
    Rule(lambda x: _provenance(x.m), "provenance must be an object (its job's na_values a list of strings)"),
    Rule(lambda x: x.imputer is None or isinstance(x.imputer, dict), "imputer must be an object or null"),
    _model,
    Rule(lambda x: {k: a.shape for k, a in x.prefixed("model/").items()} == x.template,
         lambda x: (f"model parameters {({k: a.shape for k, a in x.prefixed('model/').items()})} do not match a "
                    f"{x.model.name} model over {x.d} features and {x.c} classes {x.template}"),
         when=lambda x: x.model.name != "gbdt"),
    Rule(lambda x: all(f in x.m["encoded_columns"] for f in x.m["features"]),
         lambda x: f"features {[f for f in x.m['features'] if f not in x.m['encoded_columns']][:5]} are not in the schema"),
    _personalisation,
    # the imputer's arrays, network and finishing
    Rule(lambda x: strings(x.imputer.get("columns")) and bool(x.imputer["columns"]),
         "imputer columns must be a list of names", when=_has_imputer),
    _with_imputer(_imputer_vectors),
    Rule(lambda x: _edges(x).ndim == 2 and _edges(x).shape[0] == 2
         and not (_edges(x).size and (_edges(x).min() < 0 or _edges(x).max() >= _imputer_size(x))),
         lambda x: f"imputer/edge_index must be (2, E) indices into {_imputer_size(x)} columns", when=_has_imputer),
    Rule(lambda x: all(x.arrays[f"imputer/{k}"].shape == (_edges(x).shape[1],) for k in ("weight", "sign")),
         "imputer edge weights/signs do not match its edge list", when=_has_imputer),
    Rule(lambda x: not (x.arrays["imputer/low"] > x.arrays["imputer/high"]).any(), "imputer ranges have low > high",
         when=_has_imputer),
    _with_imputer(_imputer_network),
    # the value sets of integer-coded columns and the one-category groups (absent in older files: none)
    Rule(_levels, "imputer levels must map imputer columns to non-empty lists of finite numbers", when=_has_imputer),
    Rule(_groups, "imputer groups must be lists of at least two distinct imputer columns", when=_has_imputer),
    Rule(_disjoint_groups, "imputer groups overlap (a column in two categorical groups)", when=_has_imputer),
)


def check_manifest(m: dict[str, Any], arrays: dict[str, np.ndarray], fail: Fail) -> None:
    """Run :data:`CHECKS` over manifest ``m`` (already known to hold its keys and the declared
    arrays) and ``arrays``; the first failure calls ``fail`` with its one-line message."""
    x = Manifest(m, arrays, fail)
    for check in CHECKS:
        check(x)


def check_imputer_weights(im: Mapping[str, Any], arrays: Mapping[str, np.ndarray], fail: Fail) -> None:
    """The imputer's weights' names and shapes against the network its config describes
    (:func:`.imputer_net.weight_shapes`, the torch module's ``state_dict`` without importing torch)."""
    from .imputer_net import net_config, weight_shapes

    names = {k[len("imputer/w/"):]: a for k, a in arrays.items() if k.startswith("imputer/w/")}
    try:
        expected = weight_shapes(net_config(im["model_config"]))
    except ValueError as exc:
        fail(f"imputer model_config: {str(exc)[:160]}")
    got = {k: tuple(a.shape) for k, a in names.items()}
    if got != expected or not strings(im.get("weights")) or sorted(im["weights"]) != sorted(got):
        fail(f"imputer weights {sorted(got)[:4]}... do not match its network ({len(expected)} tensors)")
