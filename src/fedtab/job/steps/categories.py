"""Step 2, the categories: text columns get one agreed category list and every site one-hot encodes.

Each site sends only the *set* of categories it observes per text column (no counts); the
server takes the sorted union and every site encodes with it (a category below a site's
``min_rows`` becomes ``(other)`` or missing there, see :mod:`fedtab.federation.steps.encoding`).
A missing cell's indicators are all zeros, or, when the job imputes, missing (NaN): the
imputation then gives the row one category. Runs only when the schema step found text
columns (or ``[columns] categorical`` ones).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .step import Step

if TYPE_CHECKING:
    from ...federation.protocol import Federation
    from ..outputs import Outputs
    from ..spec import JobSpec

__all__ = ["STEP"]


def _needed(spec: "JobSpec", out: "Outputs") -> bool:
    schema = out.result["schema"]
    return bool(schema and schema.get("categorical"))


def _run(federation: "Federation", spec: "JobSpec", out: "Outputs") -> None:
    from fedtab.federation.steps.encoding import agree_categories, encode_categories
    from .schema import set_columns

    schema = out.result["schema"]
    cats = agree_categories(federation, schema["categorical"])
    if cats:
        # with imputation a missing category is a cell to impute (one category), else all zeros
        encode_categories(federation, cats, same_width=False, missing="nan" if spec.impute is not None else "zeros")
    schema["categories"] = cats
    set_columns(out)


STEP = Step("categories", _needed, _run)
