"""Model parameters in a message: the ``param:`` arrays of a fit or evaluation request and reply."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from fedtab.federation.protocol.messages import Message

__all__ = ["PARAM", "SETUP", "params_from", "params_to"]


#: prefix of model-parameter arrays; prefix of the setup's arrays (the first fit carries them)
PARAM = "param:"
SETUP = "setup:"
_PARAM = PARAM


def params_from(msg: Message) -> dict[str, np.ndarray]:
    """The model parameters a message carries (its ``param:`` arrays, the prefix taken off)."""
    return {k[len(_PARAM):]: v for k, v in msg.arrays.items() if k.startswith(_PARAM)}


def params_to(params: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """``params`` as a message's arrays (each name prefixed ``param:``)."""
    return {_PARAM + k: np.asarray(v) for k, v in params.items()}
