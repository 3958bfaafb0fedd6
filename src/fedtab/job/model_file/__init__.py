"""The model file ``model.fedtab``: a zip of ``manifest.json`` and ``arrays/<name>.npy``. No pickle.

Three parts: writing (:mod:`.write`, :func:`write_model` from the job workflow's ``"model"``
section plus provenance), reading with the hostile-file checks (:mod:`.read` and the table of
shape checks in :mod:`.checks`), and the model front door (:mod:`.model`, :class:`FedtabModel`:
predict, check, exports); :mod:`.format` holds the names, limits and errors they share.
Reading: :func:`load_model` validates everything before any of it is used, because a model
file may come from someone else:

* the zip holds exactly ``manifest.json`` and the arrays the manifest lists (any other
  member, a path with ``..`` or ``/`` at its start, a duplicate name is rejected); a
  member that cannot be decompressed (bad CRC, broken deflate stream, encryption) is a
  corrupted member;
* sizes are checked from the zip directory *before* reading (manifest ≤ 16 MiB and nested
  at most :data:`MAX_DEPTH` levels, at most :data:`MAX_ARRAYS` arrays of at most
  :data:`MAX_NDIM` dimensions, each array ≤ 256 MiB uncompressed and no more elements than
  its declared shape, all of them ≤ :data:`MAX_TOTAL`);
* the manifest's structure is checked (schema, categories, features, classes, provenance);
* what the model spec (and the imputer's network) would allocate is estimated before it is
  built (:func:`fedtab.learn.models.model_cost`): a spec that needs far more numbers than
  the file's arrays hold (``mlp`` with ``hidden = [10**9]``) is refused unbuilt;
* arrays are read with ``numpy.load(allow_pickle=False)``; only bool/int/float dtypes;
  each array must have the shape and dtype the manifest declares, and those shapes must
  agree with the features, classes and the model (``make_model(spec).init`` shapes) and the
  imputer's network;
* a selection's per-site personalised models (``[election] tune = "cv"``): a known mode
  (:func:`fedtab.learn.personalise.check_mode`), unique site names, and for every site exactly
  the arrays ``personal/<i>/<name>`` its mode needs (``shift`` ``(k,)``; ``scale`` ``(1,)``;
  ``coef`` / ``intercept`` of the model's shapes), float, finite; none without a personalisation;
* the imputer's finishing (``imputer.levels``: the agreed value set of each integer-coded
  column; ``imputer.groups``: the indicator columns of each categorical column) names only
  imputer columns, with non-empty sets of finite numbers and disjoint groups of two or more;
* the model's predictions on probe rows (the mean row, each feature at ±1 and ±5 standard
  deviations, all of them together) are finite probabilities, for the pooled model and each
  site's personalised one (a coefficient of 1e308 overflows to NaN): checked on write too;
* every failure is a :class:`ModelFileError` naming the file and what is wrong, in one line.

:class:`FedtabModel` (what :func:`load_model` returns) predicts on a DataFrame with the
schema's columns: categories one-hot encoded with the agreed lists, the imputer (if any)
fills missing cells and absent columns exactly as the sites filled theirs (an integer code to
the nearest value of its agreed set, a missing category to exactly one category), then the
standardisation and the model; ``site=NAME`` applies that site's personalised model
(``fedtab predict --site NAME``), without it the pooled federated model.
"""

from __future__ import annotations

from .format import FORMAT, ModelFileError, PredictionError, PredictionWarning
from .model import FedtabModel, InputCheck, probe_rows
from .read import load_model
from .write import write_model

__all__ = ["FORMAT", "FedtabModel", "InputCheck", "ModelFileError", "PredictionError", "PredictionWarning", "load_model",
           "probe_rows", "write_model"]
