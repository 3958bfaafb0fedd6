"""FLARE's component check (NVFLARE 2.9's ``ComponentPathAuthorizer``) against fedtab's job components:
the one ``RowSplit`` of the federation travels in a FLARE job and is allowed by its exact class path."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.requires("nvflare")

SITE = {"name": "site-1", "data-path": "/data/site-1.csv", "target": "y", "test-size": 0.3, "seed": 7, "folds": 3}


def _authorizer(resources_file):
    """FLARE's check as a site runs it, reading ``resources_file`` (the site's ``local/resources.json``)."""
    from nvflare.app_common.widgets.component_path_authorizer import ComponentPathAuthorizer

    authorizer = ComponentPathAuthorizer()
    workspace = SimpleNamespace(get_resources_file_path=lambda: str(resources_file))
    return lambda component: authorizer.authorize_component_config(component, workspace=workspace)


@pytest.fixture(scope="module")
def executor(tmp_path_factory, jobs) -> dict:
    """The site's executor component as FLARE writes it into an exported job."""
    from fedtab.engines import nvflare

    out = tmp_path_factory.mktemp("flare_job")
    nvflare.build_job([SITE], jobs.config(jobs.plan())).export_job(str(out))
    config = json.loads(next(out.rglob("app_site-1/config/config_fed_client.json")).read_text())
    return config["executors"][0]["executor"]


def test_there_is_one_row_split_class_and_the_job_carries_it_by_the_federations_path(executor):
    from fedtab.engines import nvflare
    from fedtab.federation.site import core

    assert nvflare.RowSplit is core.RowSplit
    split = executor["args"]["split"]
    assert split["path"] == "fedtab.federation.site.core.RowSplit" in nvflare.FLARE_COMPONENTS
    assert split["args"] == {"test_size": 0.3, "seed": 7, "folds": 3}


def test_flares_component_check_accepts_fedtabs_components_on_an_allowed_site(executor, tmp_path):
    """After :func:`allow_fedtab_components`, FLARE accepts the executor and its ``RowSplit`` and builds
    the split back as the federation's class; on a site with FLARE's default list both are refused."""
    from nvflare.apis.fl_exception import UnsafeComponentError
    from nvflare.app_common.default_component_policy import DEFAULT_CLASS_ALLOW_LIST
    from nvflare.fuel.utils.component_builder import ComponentBuilder

    from fedtab.engines.nvflare import allow_fedtab_components
    from fedtab.federation.site.core import RowSplit

    check = _authorizer(allow_fedtab_components(tmp_path / "site"))
    check(executor)
    check(executor["args"]["split"])

    class Builder(ComponentBuilder):  # FLARE's builder of job components (no module scanner needed)
        def get_module_scanner(self):
            return None

    built = Builder().build_component(executor["args"]["split"])
    assert type(built) is RowSplit and built == RowSplit(test_size=0.3, seed=7, folds=3)

    default = tmp_path / "default.json"
    default.write_text(json.dumps({"class_allow_list": list(DEFAULT_CLASS_ALLOW_LIST)}))
    for component in (executor, executor["args"]["split"]):
        with pytest.raises(UnsafeComponentError, match="not in allow_list"):
            _authorizer(default)(component)


@pytest.mark.parametrize("path", ["fedtab.federation.site.core.Site", "fedtab.federation.site.core.RowSplitter",
                                  "fedtab.federation.site.lazy.LazySite", "fedtab.job.apps.server_app",
                                  "fedtab.federation.protocol.exchange.exchange"])
def test_the_allow_list_admits_the_row_split_alone_of_the_federation(tmp_path, path):
    """A job is written by the server's side: the site's allow list names the federation's ``RowSplit``
    by its exact path, so a job cannot have the site build any other fedtab class outside the engines."""
    from nvflare.apis.fl_exception import UnsafeComponentError

    from fedtab.engines.nvflare import allow_fedtab_components

    check = _authorizer(allow_fedtab_components(tmp_path / "site"))
    with pytest.raises(UnsafeComponentError, match="not in allow_list"):
        check({"path": path, "args": {}})
