"""strata.init: build a model larger than host memory straight into the tiers (DeepSpeed's
``zero.Init``).

Inside ``with strata.init():`` every parameter of at least ``DEFERRED_MIN_NUMEL`` elements that a
module registers is replaced by a parameter of the same shape on the meta device: no memory is
touched while the model is built. ``strata.initialize`` then materializes the model one offload
unit at a time, just before the engine reads that unit's values (and frees them again): a unit's
deferred parameters are initialized by the model's Hugging Face ``_init_weights(module)`` when it
has one, else by each module's ``reset_parameters()``. A deferred parameter that neither
initializes is an error naming it (give its module a ``reset_parameters()``, or build that module
outside ``strata.init``). Smaller parameters (norm weights, biases) keep the values the module's
constructor gave them.
"""

import math
import threading

import torch

from .errors import InvalidArgumentError

DEFERRED_MIN_NUMEL = 1 << 16

_lock = threading.Lock()
_depth = 0
_original_register = torch.nn.Module.register_parameter


def _refuse_loading(module, state_dict, prefix, *args):
    for name, p in module._parameters.items():
        if p is not None and _deferred(p) and prefix + name in state_dict:
            raise InvalidArgumentError(
                f"strata.init: {prefix}{name} is deferred (on the meta device) and cannot take "
                "loaded values; load the checkpoint after strata.initialize (engine."
                "load_checkpoint), use strata.from_pretrained for a Hugging Face directory, or "
                "build the model outside strata.init")


def _register_parameter(self, name, param):
    if (isinstance(param, torch.nn.Parameter) and not param.is_meta
            and param.numel() >= DEFERRED_MIN_NUMEL and param.is_floating_point()):
        deferred = torch.nn.Parameter(torch.empty(param.shape, dtype=param.dtype, device="meta"),
                                      requires_grad=param.requires_grad)
        deferred._strata_deferred = True
        param = deferred
        if not getattr(self, "_strata_refuses_loading", False):
            # load_state_dict would copy into the meta tensor and silently keep nothing.
            self._register_load_state_dict_pre_hook(_refuse_loading, with_module=True)
            self._strata_refuses_loading = True
    _original_register(self, name, param)


class init:
    """``with strata.init(config):`` builds the model without materializing its large parameters
    (see the module comment). ``config`` is accepted for DeepSpeed's ``zero.Init`` signature;
    the engine reads it at ``strata.initialize``."""

    def __init__(self, config=None, enabled=True, **_):
        self.enabled = enabled

    def __enter__(self):
        global _depth
        if self.enabled:
            with _lock:
                if _depth == 0:
                    torch.nn.Module.register_parameter = _register_parameter
                _depth += 1
        return self

    def __exit__(self, *exc):
        global _depth
        if self.enabled:
            with _lock:
                _depth -= 1
                if _depth == 0:
                    torch.nn.Module.register_parameter = _original_register
        return False


def _deferred(p):
    return getattr(p, "_strata_deferred", False)


class Materializer:
    """Fills a model built under strata.init: prepare() before the engine is created, then
    unit(i) as the engine asks for unit i's values."""

    def __init__(self, model):
        self.model = model
        self.units = []

    def materialize(self):
        """Replaces every deferred parameter by one in CPU memory that is not touched yet (the
        engine reads a unit's values only after unit(i) filled them), in every module that holds
        it (tied parameters stay tied)."""
        replaced = {}
        for m in self.model.modules():
            for name, p in list(m._parameters.items()):
                if p is None or not _deferred(p):
                    continue
                if id(p) not in replaced:
                    q = torch.nn.Parameter(torch.empty(p.shape, dtype=torch.float32),
                                           requires_grad=p.requires_grad)
                    q._strata_deferred = True
                    replaced[id(p)] = (p, q)
                m._parameters[name] = replaced[id(p)][1]

    def prepare(self, units):
        """Initializes the deferred parameters outside the units (after materialize)."""
        self.units = [m for _, m in units]
        in_unit = {id(p) for m in self.units for p in m.parameters()}
        outside = [m for m in self.model.modules()
                   if any(_deferred(p) and id(p) not in in_unit
                          for p in m.parameters(recurse=False))]
        self._initialize(outside, "the model (outside the offload units)")

    def unit(self, index):
        m = self.units[index]
        holders = [s for s in m.modules()
                   if any(_deferred(p) for p in s.parameters(recurse=False))]
        self._initialize(holders, f"offload unit {index}", scope=m)

    def _initialize(self, holders, where, scope=None):
        """Fills the deferred parameters of `holders`: the model's Hugging Face _init_weights over
        every module of `scope` (children first, as post_init's apply does; some inits key on a
        parent module), else each holder's reset_parameters()."""
        hf_init = getattr(self.model, "_init_weights", None)
        with torch.no_grad():
            params = [(s, n, p) for s in holders for n, p in s.named_parameters(recurse=False)
                      if _deferred(p)]
            if not params:
                return
            for _, _, p in params:
                p.fill_(math.nan)
            if callable(hf_init):
                modules = list(scope.modules())[::-1] if scope is not None else holders
                for s in modules:
                    hf_init(s)
            for s in holders:
                if any(torch.isnan(p).any() for h, _, p in params if h is s) and \
                        hasattr(s, "reset_parameters"):
                    s.reset_parameters()
            for s, n, p in params:
                if torch.isnan(p).any():
                    raise InvalidArgumentError(
                        f"strata.init: parameter {n} of {type(s).__name__} in {where} was "
                        "not initialized: its module has no reset_parameters() and the "
                        "model no _init_weights() for it; add one, or build this module "
                        "outside strata.init")
            for _, _, p in params:
                p._strata_deferred = False


def materializer(model):
    """A Materializer when ``model`` has parameters deferred by strata.init, else None."""
    if any(_deferred(p) for p in model.parameters()):
        return Materializer(model)
    return None
