"""Build a :class:`~fedtab.federation.site.core.Site` from a flat, string-friendly config.

Both distributed engines start a site from configuration rather than from Python
objects: Flower from a SuperNode's ``--node-config``, NVIDIA FLARE from an executor's
job arguments. This module turns such a mapping into a ``Site`` so the two engines
(and the in-process reference) build sites the same way. It imports no engine.

Keys (hyphens and underscores are interchangeable)::

    name        the site's name (required)
    data-path   CSV/Parquet file with the site's rows (required)
    target      label column ("" = none, for unsupervised work)
    test-path   optional file with the site's held-out rows; when given, every row of
                data-path is a training row and every row of test-path a test row
                (no random split)
    test-size   fraction held out when there is no test-path (default 0.2)
    seed        seed of that split and of the site's other draws (default 0 for a site built
                directly; on Flower and FLARE the site's own, see "The site's split" below)
    na-values   strings read as missing: a list, a JSON list ('["?", "NA"]') or one
                comma-separated string ("?,NA") (default: none beyond pandas' own)
    sep         the CSV field separator (default: sniffed: ",", ";", tab or "|")
    decimal     the CSV decimal mark, "." or "," (default: sniffed)
    label-map   JSON object {label: agreed label} applied to the target column before
                anything else (the job's ``[labels] map``)
    selector    a built-in selector name ("lasso"), a JSON spec
                ('{"name": "lasso", "params": {...}}') or an alias from
                :data:`SELECTOR_ALIASES` (default "lasso")
    policy      the site's disclosure policy as a JSON object
                ('{"min_rows": 20, "max_rounds": 50}'; see fedtab.privacy.DisclosurePolicy)
    task        how the site reads its target: "auto" (default: a number with many values is
                continuous, see fedtab.learn.tasks.target_kind), "classes" or "regression"
                (the job's ``[training] task``)
    min-rows    shorthand for the policy's min_rows (overrides the one in policy)
    folds       the most cross-validation folds the site draws of its training rows
                (default 5; see fedtab.federation.site.parts)
    state-dir   the site's state folder: its ledger (what it answered and released,
                fedtab.privacy.ledger) is kept there across runs and restarts; without
                it the ledger lives with the site object (one process, one run), so its
                period budget (epsilon_budget) resets with every run, and the engine
                says so at the run's start (:func:`warn_without_state_dir`). ``fedtab
                deploy`` writes one into every site's configuration. The site's
                prepared table is cached there too (:mod:`fedtab.engines.table_cache`).

Secure aggregation (the site's own configuration, never the job's or the server's)::

    identity-key        the site's identity key: ``fedtab deploy``'s sites/<site>.key
                        (EC P-384, OpenSSH or PEM; the SuperNode's authentication key)
    consortium-keys     the consortium's key list, ``fedtab deploy``'s site-keys.json
    root-certificates   the consortium CA certificate (ca.pem) whose signature of the key
                        list the site checks
    consortium-keys-signature
                        that signature (default: <consortium-keys>.sig)

A site with none of them refuses secure aggregation; one with some but not all refuses it
naming what is missing (see :mod:`fedtab.privacy.identity`).

The site's split (``test-size``, ``seed``, ``folds``: :data:`SPLIT_KEYS`) is the site's own on
Flower and FLARE, whose run config or job the server's side writes (issue 28: a server that ran a
job twice with two seeds or test sizes would get two test parts that differ by a few rows, and the
difference of two honest releases over them isolates those rows). :func:`own_split` takes each key
from the site's own configuration (node config, ``local/fedtab-site.json``), else the defaults
(0.2, 5 folds) and, for the seed, a secret the site draws once with :mod:`secrets` and keeps in
its state folder (:func:`kept_seed`, so every run of the site draws the same parts); a site without
a state folder uses a secret its engine keeps for the run (Flower: the node's ``Context.state``,
which the SuperNode keeps across the run's ClientApp processes and never sends), else one drawn
for the process, and says so (:func:`warn_without_state_dir`). A job's or run config's values for
these keys are ignored and logged. In-process (``engine = "local"``) the job is the whole
consortium, and its seed is the sites' own.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping


from ..privacy.identity import SiteIdentity
from ..privacy.policy import DisclosurePolicy, policy_from_config
from fedtab.federation.site.lazy import LazySite
from fedtab.federation.site.core import Site, site_ledger

if TYPE_CHECKING:  # pandas when a table is read (not for a step answered from the site's state)
    import pandas as pd

__all__ = ["FixedSplitSite", "IDENTITY_KEYS", "JOB_SITE_KEYS", "NVFLARE_LASSO", "POLICY_STRICTER", "SEED_FILE",
           "SELECTOR_ALIASES", "SITE_OWNED_KEYS", "SPLIT_KEYS", "build_lazy_site", "build_site", "draw_secret_seed",
           "kept_seed", "own_over_job", "own_split", "parse_na_values", "parse_selector", "site_config",
           "site_identity", "site_policy", "split_differs", "stricter_policy", "warn_without_state_dir",
           "with_job_settings"]

log = logging.getLogger("fedtab.site")

#: FLARE 2.9's ``FeatureElectionExecutor(fs_method="lasso")``: ``Lasso(alpha=0.01)`` regression
#: on standardised X with the class labels as a continuous target, kept where ``|coef| > 1e-6``.
NVFLARE_LASSO: dict[str, Any] = {"name": "lasso", "params": {"alpha": 0.01, "task": "regression", "tol": 1e-6}}

#: selector names accepted in a site config besides the built-in selector names.
SELECTOR_ALIASES: dict[str, dict[str, Any]] = {"nvflare-lasso": NVFLARE_LASSO}


class FixedSplitSite(Site):
    """A site whose train and test rows are given (no random split).

    Args:
        name, target: as :class:`~fedtab.federation.site.core.Site`.
        train: the training rows. test: the held-out rows (same columns; may be empty).
        site_options: :class:`~fedtab.federation.site.core.Site`'s keyword arguments but
            ``test_size`` (``selector``, ``seed``, ``policy``, ``folds``, ``state_dir``, ``task``),
            passed on unchanged.

    Raises:
        ValueError: the two tables have different columns, or as ``Site``.
        TypeError: a keyword argument ``Site`` does not take, or ``test_size``.
    """

    def __init__(self, name: str, train: pd.DataFrame, test: pd.DataFrame, target: str | None = None,
                 **site_options: Any) -> None:
        if list(train.columns) != list(test.columns):
            raise ValueError(f"site {name!r}: the train and test tables have different columns")
        unlabelled = 0
        if target is not None and target in train.columns:  # drop unlabelled rows per part, before the split
            unlabelled = int(train[target].isna().sum() + test[target].isna().sum())
            train, test = train[train[target].notna()], test[test[target].notna()]
        import pandas as pd

        self._n_train = len(train)
        super().__init__(name, pd.concat([train, test], ignore_index=True), target, test_size=0.0, **site_options)
        self.unlabelled_rows = unlabelled

    def _draw_parts(self):  # noqa: ANN202 - RowParts
        from fedtab.federation.site.parts import fixed_parts

        return fixed_parts(self._n_train, len(self.table) - self._n_train, self._labels(), folds=self.folds,
                           min_rows=self.policy.min_rows, seed=self.seed)


def site_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """Normalise keys (``data-path`` and ``data_path`` both become ``data_path``)."""
    return {str(k).replace("-", "_"): v for k, v in config.items()}


def parse_selector(value: Any) -> Any:
    """A selector spec from a config value: name, alias, JSON object string, or as given.

    Raises:
        ValueError: a string that starts with ``{`` but is not valid JSON.
    """
    if not isinstance(value, str):
        return value
    text = value.strip()
    if text in SELECTOR_ALIASES:
        return SELECTOR_ALIASES[text]
    if text.startswith("{"):
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"selector {text!r} is not valid JSON: {exc}") from None
    return text


def parse_na_values(value: Any) -> list[str]:
    """Missing-value strings from a config value (list, JSON list text, comma-separated text or empty).

    Raises:
        ValueError: not a list of strings.
    """
    if value in (None, ""):
        return []
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                value = json.loads(text)
            except json.JSONDecodeError as exc:
                raise ValueError(f"na-values {text!r} is not a valid JSON list: {exc}") from None
        else:
            return [v for v in text.split(",") if v]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"na-values must be a list of strings, got {value!r}")
    return list(value)


#: keys a job may set for a site that its own (node) config leaves out; never where the
#: site's data is (``data-path``, ``test-path``), its disclosure policy or how it draws its row
#: parts (:data:`SPLIT_KEYS`: a job's values for those are ignored, :func:`with_job_settings`).
JOB_SITE_KEYS = ("target", "na_values", "selector", "sep", "decimal", "label_map", "task")

#: the (normalised) site-config keys of how a site draws its row parts
#: (:class:`~fedtab.federation.site.core.RowSplit`): the site's own on Flower and FLARE (:func:`own_split`)
SPLIT_KEYS = ("test_size", "seed", "folds")


def _decoded(value: Any, what: str) -> Any:
    """``value`` decoded from JSON when it is text (a run or node config carries objects as JSON
    strings), else as it is.

    Raises:
        ValueError: text that is not valid JSON, naming ``what``.
    """
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{what} is not valid JSON: {exc}") from None


def with_job_settings(node_config: Mapping[str, Any], site_settings: Any) -> dict[str, Any]:
    """The node's config completed with the job's settings for its site.

    ``site_settings`` is the run config's ``site-settings``: ``{site: {key: value}}`` (or
    the same as JSON text; empty = nothing to add), keys from :data:`JOB_SITE_KEYS`. The
    entry of the node's declared ``name`` fills the keys the node config does not set; a
    key the node sets wins (a site may pin its own label column or selector). Values for the
    split (:data:`SPLIT_KEYS`: ``test-size``, ``seed``, ``folds``) are the site's own and are
    dropped here, with a warning naming them when they differ from the node's
    (:func:`own_split` completes the node's split).

    Raises:
        ValueError: ``site_settings`` is not a JSON object of objects, or it sets a key
            outside :data:`JOB_SITE_KEYS` for this site (a server must not choose which
            file a site reads or relax its disclosure policy).
    """
    out = dict(node_config)
    if site_settings in (None, ""):
        return out
    settings = _decoded(site_settings, "run config site-settings")
    if not isinstance(settings, Mapping) or not all(isinstance(v, Mapping) for v in settings.values()):
        raise ValueError("run config site-settings must map site names to objects of settings")
    name = str(node_config.get("name", ""))
    mine = site_config(settings.get(name, {}))
    own = site_config(node_config)
    sent = {k: mine.pop(k) for k in SPLIT_KEYS if k in mine}
    ignored = [k.replace("_", "-") for k, v in sent.items() if str(v) != str(own.get(k))]
    if ignored:
        log.warning("site %r: the run config's %s ignored: a site draws its row parts from its own split and "
                    "secret seed (its node config), never the server's", name,
                    ", ".join(ignored) + (" is" if len(ignored) == 1 else " are"))
    refused = sorted(set(mine) - set(JOB_SITE_KEYS))
    if refused:
        raise ValueError(f"site {name!r} refuses job settings {', '.join(k.replace('_', '-') for k in refused)} "
                         f"(a job may set only {', '.join(k.replace('_', '-') for k in JOB_SITE_KEYS)})")
    for key, value in mine.items():
        if key not in own:
            out[key.replace("_", "-")] = value
    return out


# ----------------------------------------------------------------------------- the site's own split
#: the file in a site's state folder that keeps the secret seed it drew once (:func:`kept_seed`)
SEED_FILE = "split-seed"
#: the split of a site whose own configuration sets none of its keys (the seed excepted)
_SPLIT_DEFAULTS = {"test_size": 0.2, "folds": 5}


def draw_secret_seed() -> int:
    """A fresh secret seed in ``[0, 2**32)`` (:mod:`secrets`: no one can predict or replay it)."""
    return secrets.randbelow(2**32)


def _read_seed(path: Path) -> int:
    text = path.read_text().strip()
    try:
        seed = int(text)
    except ValueError:
        raise ValueError(f"{path}: the site's seed file is damaged (not an integer); restore it from a backup, or "
                         "delete it to draw a new seed (the site's row parts then change)") from None
    if not 0 <= seed < 2**32:
        raise ValueError(f"{path}: the site's seed must be in [0, 2**32), got {seed}")
    return seed


def kept_seed(state_dir: str | Path) -> int:
    """The site's secret seed kept in ``state_dir/``:data:`SEED_FILE`: read, or (first use) drawn
    with :func:`draw_secret_seed` and written (mode 0600). Two processes drawing at once keep the
    first file written (a hard link never replaces an existing file), so both read the same seed.

    Raises:
        ValueError: the file exists but holds no seed (naming it).
        OSError: the state folder cannot be created or written.
    """
    path = Path(state_dir, SEED_FILE)
    if path.is_file():
        return _read_seed(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{SEED_FILE}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(f"{draw_secret_seed()}\n")
    try:
        os.link(tmp, path)
    except FileExistsError:  # another process drew first: its seed is the site's
        pass
    except OSError:  # a file system without hard links
        if not path.exists():
            os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return _read_seed(path)


def _split_value(key: str, value: Any) -> Any:
    """``value`` of split key ``key`` as a number (``test_size`` float, ``seed``/``folds`` int).

    Raises:
        ValueError: not a number of that kind (naming the key).
    """
    if key == "folds":
        return _folds({"folds": value})
    try:
        number = float(value) if key == "test_size" else int(str(value).strip())
    except (TypeError, ValueError):
        kind = "a number" if key == "test_size" else "an integer"
        raise ValueError(f"site config: {key.replace('_', '-')} must be {kind}, got {value!r}") from None
    return number


def own_split(config: Mapping[str, Any], *, seed: int | None = None) -> dict[str, Any]:
    """The site config ``config`` (the site's own keys, and what a job may add: its split keys are
    never a job's) with its split (:data:`SPLIT_KEYS`) the site's own, as numbers:

    * ``test_size`` and ``folds``: the config's, else 0.2 and 5;
    * ``seed``: the config's; else the secret kept in its ``state_dir`` (:func:`kept_seed`: drawn
      once, so every run of the site draws the same parts); else ``seed`` (a secret the engine
      keeps for the run, e.g. in a Flower node's ``Context.state``); else a fresh secret for this
      call, with a warning that another process or run draws other parts.

    Raises:
        ValueError: a split value that is not a number of its kind, or a damaged seed file.
        OSError: the state folder cannot be written.
    """
    cfg = site_config(config)
    out = dict(cfg)
    for key, default in _SPLIT_DEFAULTS.items():
        out[key] = _split_value(key, cfg[key]) if cfg.get(key) not in (None, "") else default
    if cfg.get("seed") not in (None, ""):
        out["seed"] = _split_value("seed", cfg["seed"])
    elif cfg.get("state_dir") not in (None, ""):
        out["seed"] = kept_seed(cfg["state_dir"])
    elif seed is not None:
        out["seed"] = int(seed)
    else:
        out["seed"] = draw_secret_seed()
        log.warning("site %r has neither a seed nor a state folder (state-dir): it drew a secret seed for this "
                    "process only, so another process or run draws other row parts (and a server could "
                    "difference releases over them); set state-dir in the site's own configuration",
                    str(cfg.get("name", "")))
    return out


def split_differs(sent: Mapping[str, Any], own: Mapping[str, Any]) -> list[str]:
    """The split keys (hyphenated) where what a job ``sent`` differs from the site's ``own``
    split (:func:`own_split`'s output); a value that is not a number of its kind differs."""
    out = []
    for key in SPLIT_KEYS:
        if key not in sent or sent[key] in (None, ""):
            continue
        try:
            same = _split_value(key, sent[key]) == own.get(key)
        except ValueError:
            same = False
        if not same:
            out.append(key.replace("_", "-"))
    return out


def build_site(config: Mapping[str, Any]) -> Site:
    """The :class:`Site` described by ``config`` (see the module docstring).

    With a ``state-dir`` the prepared table (parsed, typed, parts drawn) is kept in the
    site's state folder (:mod:`fedtab.engines.table_cache`, keyed by the file's content hash
    and the settings that shape it): only the first site built from a file reads it.

    Raises:
        ValueError: a required key is missing or a value is invalid (naming it).
        fedtab.data.TableError: a data file cannot be read.
    """
    cfg = _checked(config)
    name = str(cfg["name"])
    target = cfg.get("target") or None
    selector = parse_selector(cfg.get("selector") or "lasso")
    seed = int(cfg.get("seed", 0))
    policy = site_policy(cfg)
    folds, state_dir = _folds(cfg), cfg.get("state_dir") or None
    task = str(cfg.get("task") or "auto")
    cache = key = cached = None
    if state_dir is not None:
        from .table_cache import TableCache, cache_key

        try:
            cache, key = TableCache(state_dir), cache_key(cfg)
            cached = cache.load(key)
        except OSError:  # an unreadable file: read_table below names it
            cache = None
    if cached is not None:
        table, test = cached.table, cached.test
    else:
        table, test = _read_tables(cfg, target)
    site_cls = FixedSplitSite if test is not None else Site
    site = site_cls.__new__(site_cls)
    if cached is not None:  # the stored parts, not drawn again (checked against the table below)
        site._draw_parts = lambda: cached.parts  # type: ignore[method-assign]
    if test is not None:
        site.__init__(name, table, test, target, selector=selector, seed=seed, policy=policy, folds=folds,
                      state_dir=state_dir, task=task)
    else:
        site.__init__(name, table, target, test_size=float(cfg.get("test_size", 0.2)), seed=seed,
                      selector=selector, policy=policy, folds=folds, state_dir=state_dir, task=task)
    if cached is not None:
        del site._draw_parts
        if site.parts.n_rows != len(site.table):  # a damaged entry that still hashed right: draw them
            site.parts = site._draw_parts()
    elif cache is not None and key is not None:
        from .table_cache import CachedTables

        cache.store(key, CachedTables(table, test, site.parts))
    site.identity = site_identity(cfg)
    return site


def _read_tables(cfg: Mapping[str, Any], target: str | None) -> tuple["pd.DataFrame", "pd.DataFrame | None"]:
    """The site's table and held-out table (``None`` without ``test-path``) read from their files."""
    from ..data.tables import read_table

    na_values = parse_na_values(cfg.get("na_values"))
    read = {"sep": cfg.get("sep") or None, "decimal": cfg.get("decimal") or None}
    table = _mapped(read_table(str(cfg["data_path"]), na_values, **read), target, cfg.get("label_map"))
    test = None
    if cfg.get("test_path"):
        test = _mapped(read_table(str(cfg["test_path"]), na_values, **read), target, cfg.get("label_map"))
    return table, test


def _mapped(table: "pd.DataFrame", target: str | None, label_map: Any) -> "pd.DataFrame":
    """``table`` with its target's labels replaced as ``label_map`` says (see :func:`fedtab.data.tables.map_labels`)."""
    if label_map in (None, "") or target is None:
        return table
    from ..data.tables import map_labels

    label_map = _decoded(label_map, "label-map")
    if not isinstance(label_map, Mapping):
        raise ValueError(f"label-map must be a JSON object {{label: agreed label}}, got {type(label_map).__name__}")
    return map_labels(table, target, label_map)


def _folds(cfg: Mapping[str, Any]) -> int:
    value = cfg.get("folds", 5)
    try:
        folds = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"site config: folds must be a non-negative integer, got {value!r}") from None
    if folds < 0 or str(value).strip() not in (str(folds), f"{folds}.0"):
        raise ValueError(f"site config: folds must be a non-negative integer, got {value!r}")
    return folds


def _checked(config: Mapping[str, Any]) -> dict[str, Any]:
    cfg = site_config(config)
    missing = [k for k in ("name", "data_path") if not cfg.get(k)]
    if missing:
        raise ValueError(f"site config misses {', '.join(k.replace('_', '-') for k in missing)}")
    return cfg


def build_lazy_site(config: Mapping[str, Any]) -> LazySite:
    """The site of ``config`` as a :class:`~fedtab.federation.site.lazy.LazySite`: its file is
    read (by :func:`build_site`) only when a request needs the table.

    Raises:
        ValueError: a required key is missing, a data file does not exist, or the policy
            is invalid (the rest of the config and the files' content are checked when the
            table is read).
    """
    from pathlib import Path

    cfg = _checked(config)
    for key in ("data_path", "test_path"):
        if cfg.get(key) and not Path(str(cfg[key])).is_file():
            raise ValueError(f"site {cfg['name']!r}: {key.replace('_', '-')} {cfg[key]}: no such file")
    site = LazySite(str(cfg["name"]), lambda: build_site(config), target=cfg.get("target") or None,
                    policy=site_policy(cfg))
    site.ledger = site_ledger(site, cfg.get("state_dir") or None)
    site.identity = site_identity(cfg)
    return site


#: the (normalised) site-config keys of a site's secure-aggregation identity
IDENTITY_KEYS = ("identity_key", "consortium_keys", "root_certificates", "consortium_keys_signature")


def site_identity(config: Mapping[str, Any]) -> SiteIdentity | None:
    """The secure-aggregation identity of a (normalised) site config, read when first used:
    ``None`` without any identity key; an unusable identity naming what is missing when
    only some are set."""
    cfg = site_config(config)
    given = {k: str(cfg[k]) for k in IDENTITY_KEYS if cfg.get(k) not in (None, "")}
    if not given:
        return None
    name = str(cfg.get("name", ""))
    missing = [k.replace("_", "-") for k in IDENTITY_KEYS[:3] if k not in given]
    if missing:
        return SiteIdentity.unusable(name, f"the site config sets {', '.join(k.replace('_', '-') for k in given)} "
                                           f"but not {', '.join(missing)}")
    return SiteIdentity.from_files(name, given["identity_key"], given["consortium_keys"], given["root_certificates"],
                                   given.get("consortium_keys_signature"))


def warn_without_state_dir(site: Site, config: Mapping[str, Any], engine: str) -> bool:
    """Log a warning naming ``site`` when its (node) ``config`` sets no ``state-dir``: its
    ledger then lives only as long as the ``engine``'s run or process, so the budgets it
    keeps per period (ε) reset with them; and unless the config sets a ``seed``, so does the
    secret seed of its row parts (:func:`own_split`), so the next run draws other parts.
    Returns whether it warned."""
    cfg = site_config(config)
    if cfg.get("state_dir") not in (None, ""):
        return False
    parts = "" if cfg.get("seed") not in (None, "") else (
        "; and its row parts (test part, folds) come from a secret seed kept only for this run, so the next run "
        "draws other parts, and a curious server can difference two runs' releases over parts that differ by a "
        "few rows")
    logging.getLogger("fedtab.site").warning(
        "site %r has no state folder (state-dir): its ledger lives only as long as this %s run or process, so "
        "its budgets reset with it (epsilon_budget and every cap start afresh in the next run)%s; set state-dir in "
        "the site's own configuration (fedtab deploy writes one)", site.name, engine, parts)
    return True


def site_policy(config: Mapping[str, Any]) -> DisclosurePolicy:
    """The disclosure policy of a (normalised) site config: ``policy`` JSON, then ``min_rows``.

    Raises:
        ValueError: invalid policy JSON or settings, or a non-integer ``min-rows``.
    """
    policy = policy_from_config(config.get("policy"))
    if config.get("min_rows") not in (None, ""):
        try:
            min_rows = int(config["min_rows"])
        except (TypeError, ValueError):
            raise ValueError(f"site config: min-rows must be an integer, got {config['min_rows']!r}") from None
        policy = replace(policy, min_rows=min_rows)
    return policy


# ----------------------------------------------------------------------------- the site's own config over a job's
#: how a job's value of each :class:`~fedtab.privacy.policy.DisclosurePolicy` setting may move the
#: site's own: ``"max"`` (a larger value is stricter: floors, require flags), ``"min"`` (a smaller
#: value is stricter: caps, budgets, ``allow_*`` flags) or ``"site"`` (the site's value always: the
#: ledger's period, whose change could shift the period a budget is spent in). Every setting is
#: listed (a test checks it), so a new one cannot silently take the job's value.
POLICY_STRICTER: dict[str, str] = {
    "min_rows": "max", "min_peers": "max", "require_secure_aggregation": "max", "require_dp": "max",
    "max_rounds": "min", "max_local_epochs": "min", "max_evaluations": "min", "max_param": "min",
    "allow_server_selector": "min", "max_score_bins": "min", "max_releases_per_part": "min",
    "max_model_abs": "min", "max_epsilon_per_release": "min", "epsilon_budget": "min", "delta": "min",
    "max_work": "min", "max_size": "min", "allow_server_row_sets": "min", "max_split_thresholds": "min",
    "max_models_per_request": "min", "period_days": "site",
}


def stricter_policy(own: DisclosurePolicy, job: Mapping[str, Any]) -> tuple[DisclosurePolicy, list[str]]:
    """The site's own policy ``own`` tightened by the settings a job names (``job``: ``{setting:
    value}``, hyphens allowed; settings it does not name stay the site's), and the settings where
    the job asked for less than ``own`` (ignored: a job may only tighten, :data:`POLICY_STRICTER`).

    Raises:
        ValueError: an unknown setting or an invalid value in ``job`` (as ``DisclosurePolicy``).
        KeyError: a policy setting :data:`POLICY_STRICTER` does not list (a programming error).
    """
    named = {str(k).replace("-", "_"): v for k, v in job.items()}
    asked = DisclosurePolicy.from_dict({**own.to_dict(), **named})  # checks the job's values
    merged = own.to_dict()
    relaxed: list[str] = []
    for name in sorted(named):
        mine, theirs = merged[name], getattr(asked, name)
        rule = POLICY_STRICTER[name]
        value = mine if rule == "site" else max(mine, theirs) if rule == "max" else min(mine, theirs)
        if theirs != mine and value == mine:
            relaxed.append(name)
        merged[name] = value
    return DisclosurePolicy(**merged), relaxed


def _policy_settings(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The policy settings a (normalised) site config names: its ``policy`` object and ``min-rows``.

    Raises:
        ValueError: a policy that is not a JSON object or a policy, or a non-integer ``min-rows``.
    """
    value = cfg.get("policy")
    if isinstance(value, DisclosurePolicy):
        named = value.to_dict()
    elif value in (None, ""):
        named = {}
    else:
        named = _decoded(value, "disclosure policy")
        if not isinstance(named, Mapping):
            raise ValueError(f"disclosure policy must be a JSON object, got {type(named).__name__}")
        named = dict(named)
    if cfg.get("min_rows") not in (None, ""):
        named["min_rows"] = site_policy({"min_rows": cfg["min_rows"]}).min_rows
    return named


#: (normalised) site-config keys that belong to the site alone on an engine whose job the server
#: writes (NVIDIA FLARE): which files it reads, where it keeps its ledger, its identity. A job's
#: value is ignored when the site's own config sets the key.
SITE_OWNED_KEYS = ("data_path", "test_path", "state_dir", *IDENTITY_KEYS)
_POLICY_KEYS = ("policy", "min_rows")


def own_over_job(own: Mapping[str, Any], job: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """A site config from the site's ``own`` config and a ``job``'s (both flat site configs, see the
    module docstring), and what of the job's was ignored (``"data-path"``, ``"policy.min_rows"`` ...).

    * every key the site's own config sets wins over the job's (its files, its state folder, its
      identity, its label column or selector when it pins them);
    * the disclosure policy is the site's own (``policy`` + ``min-rows``; the defaults of
      :class:`~fedtab.privacy.policy.DisclosurePolicy` when it sets none) tightened by the job's:
      :func:`stricter_policy` — a job may raise ``min_rows`` or set ``require_dp``, never lower,
      unset or allow anything;
    * a key only the job sets is taken from it, so a site without a config of its own still runs
      (the file named by the job, the default policy as its floor).

    Raises:
        ValueError: an invalid policy or ``min-rows`` on either side.
    """
    mine, theirs = site_config(own), site_config(job)
    out = {k: v for k, v in theirs.items() if k not in _POLICY_KEYS and v not in (None, "")}
    ignored = sorted(k.replace("_", "-") for k, v in theirs.items()
                     if k not in _POLICY_KEYS and mine.get(k) not in (None, "") and v not in (None, "")
                     and str(v) != str(mine[k]))
    out.update({k: v for k, v in mine.items() if k not in _POLICY_KEYS and v not in (None, "")})
    policy, relaxed = stricter_policy(site_policy(mine), _policy_settings(theirs))
    out["policy"] = policy.to_dict()
    return out, ignored + [f"policy.{name}" for name in relaxed]
