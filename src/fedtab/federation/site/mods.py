"""Site-side mods: the wrappers a mode puts around a handler, chosen once, in ``Site.handle``.

The site-side analogue of Flower's client *mods* (``flwr.client.mod.LocalDpMod``,
``fixedclipping_mod``): a :data:`SiteMod` is ``mod(site, request, call_next) -> reply``; it may
change the request on the way in and the reply on the way out. A handler tests no mode; a
kind's declaration (:attr:`fedtab.federation.protocol.kinds.MessageKind.mods`) names, per mode,
the mods that apply, and :func:`answer` — called once by ``Site.handle`` where it runs the
handler — reads the request's modes from its meta (:func:`request_modes`) and composes them.

Two shapes of mod:

* a *release* mod turns the handler's exact statistics into what the site releases under the
  mode (e.g. DP: Gaussian noise at the sensitivities of the clipped values);
* a *parameter* mod sets the algorithm's own parameters (:func:`with_params`: e.g. clip the
  values into the public bounds, no suppression, the noise of DP gradient steps): the algorithm
  branches on its parameter, never on the mode. The parameters ride in the request under
  :data:`SITE_PARAMS`, which only a mod sets: :func:`answer` drops that key from what the server
  sent, so a server cannot choose them.

A new mode is one entry of :data:`MODE_META` (:func:`register_mode`: the request meta key that
puts a request in it) and the mods its kinds declare.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Mapping

from fedtab.federation.protocol.messages import Message
from fedtab.privacy.dp import DP_META
from fedtab.privacy.secagg import SECAGG_META

if TYPE_CHECKING:  # pragma: no cover
    from fedtab.federation.protocol.kinds import MessageKind
    from fedtab.federation.site.core import Site

__all__ = ["SiteMod", "MODE_META", "SITE_PARAMS", "register_mode", "forget_mode", "request_modes", "site_params",
           "with_params", "answer", "dp_noise_param", "secure_masked_param"]

Handler = Callable[["Site", Message], Message]
#: ``mod(site, request, call_next) -> reply``; ``call_next(site, request)`` runs the next mod or the handler
SiteMod = Callable[["Site", Message, Handler], Message]

#: mode -> the request meta key whose presence puts a request in that mode, in the order the mods
#: compose (the first mode's mods are the outermost)
MODE_META: dict[str, str] = {"dp": DP_META, "secure": SECAGG_META}

#: request meta key of the algorithm parameters a mod sets (:func:`with_params`); never the server's
SITE_PARAMS = "site:params"


def register_mode(mode: str, meta_key: str) -> None:
    """Let requests carrying ``meta_key`` in their meta be in ``mode`` (a new mode's one entry).

    Raises:
        ValueError: ``mode`` is registered with another key.
    """
    if MODE_META.get(mode, meta_key) != meta_key:
        raise ValueError(f"site mode {mode!r} is already registered with meta key {MODE_META[mode]!r}")
    MODE_META[mode] = meta_key


def forget_mode(mode: str) -> None:
    """Remove ``mode`` (a test's toy mode); unknown modes are ignored."""
    MODE_META.pop(mode, None)


def request_modes(meta: Mapping[str, Any]) -> tuple[str, ...]:
    """The modes a request's ``meta`` puts it in, in :data:`MODE_META` order."""
    return tuple(mode for mode, key in MODE_META.items() if key in meta)


def site_params(request: Message | Mapping[str, Any]) -> Mapping[str, Any]:
    """The algorithm parameters the mods set on ``request`` (or on a request's meta); empty: none,
    the handler's defaults."""
    params = (request.meta if isinstance(request, Message) else request).get(SITE_PARAMS)
    return params if isinstance(params, Mapping) else {}


def with_params(request: Message, **params: Any) -> Message:
    """``request`` with the algorithm parameters ``params`` added to those mods set before."""
    return Message(request.kind, request.arrays, {**request.meta, SITE_PARAMS: {**site_params(request), **params}})


def dp_noise_param(site: "Site", request: Message, call_next: Handler) -> Message:
    """A DP parameter mod: the request's DP settings (noise multiplier, bounds, clip, gradient
    steps; on the site's terms, ``Site.dp_terms``) as the algorithm's ``noise`` parameter, for an
    algorithm that noises inside its own computation (DP gradient steps, a clipped update)."""
    return call_next(site, with_params(request, noise=request.meta[DP_META]))


def secure_masked_param(site: "Site", request: Message, call_next: Handler) -> Message:
    """A secure-sums parameter mod: the algorithm's ``masked`` parameter (its sums leave masked, so it
    adds no per-site number in the clear beside them and records that it answered masked)."""
    return call_next(site, with_params(request, masked=True))


def _bind(mod: SiteMod, call_next: Handler) -> Handler:
    return lambda site, request: mod(site, request, call_next)


def answer(kind: "MessageKind", site: "Site", request: Message, handler: Handler) -> Message:
    """``handler``'s reply to ``request`` wrapped in the mods ``kind`` declares for the request's modes
    (:func:`request_modes`; outermost first). A :data:`SITE_PARAMS` the server sent is dropped."""
    if SITE_PARAMS in request.meta:
        request = Message(request.kind, request.arrays, {k: v for k, v in request.meta.items() if k != SITE_PARAMS})
    call = handler
    for mod in reversed([m for mode in request_modes(request.meta) for named, m in kind.mods if named == mode]):
        call = _bind(mod, call)
    return call(site, request)
