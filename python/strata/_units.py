"""Offload units of a Python model: which submodules they are, and the hooks around their calls.

A unit's parameters live in strata's tiers. Each call of the unit (``module.forward`` is wrapped)
gathers them onto the device, runs the original forward without building a graph, and releases
them; only the unit's inputs are kept (the activation checkpoint). Its backward gathers them
again, recomputes the forward from the kept inputs (with the random state of the first run, so
dropout draws the same mask), differentiates it, hands the parameters' gradients to the engine
and releases them: what ``runtime/engine/offload_unit.cc`` does for the C++ models, and what
DeepSpeed's ZeRO-3 with activation checkpointing does with its module hooks.

A forward that builds no graph (``torch.no_grad()``, evaluation) gathers and releases without
recording the order the engine prefetches along.
"""

import contextlib
import weakref

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from .errors import InvalidArgumentError


def find_units(model, class_names=None):
    """The offload units of ``model``: [(path, module)], outermost first, in module order.

    ``class_names``: the classes named by ``"strata": {"offload_unit_classes": [...]}``; else the
    model's ``_no_split_modules`` (Hugging Face models name their decoder layer there); else its
    top-level children, where a ModuleList or Sequential child stands for its elements.
    """
    if not class_names:
        class_names = list(getattr(model, "_no_split_modules", None) or [])
    if class_names:
        wanted = set(class_names)
        units = []
        _collect(model, "", wanted, units)
        if not units:
            raise ValueError(
                "no submodule of the model is of the offload unit classes "
                f"{sorted(wanted)} (strata.offload_unit_classes or the model's _no_split_modules)"
            )
        return units
    units = []
    for name, child in model.named_children():
        if isinstance(child, (torch.nn.ModuleList, torch.nn.Sequential)) and len(child) > 0:
            for sub_name, sub in child.named_children():
                units.append((f"{name}.{sub_name}", sub))
        else:
            units.append((name, child))
    return [(p, m) for p, m in units if any(True for _ in m.parameters())]


def _collect(module, prefix, wanted, out):
    for name, child in module.named_children():
        path = f"{prefix}{name}"
        cls = type(child)
        if cls.__name__ in wanted or f"{cls.__module__}.{cls.__qualname__}" in wanted:
            out.append((path, child))
        else:
            _collect(child, path + ".", wanted, out)


def all_parameter_uses(module, prefix=""):
    """Every (name, parameter) the module tree holds, a shared parameter once per holder."""
    for name, p in module._parameters.items():
        if p is not None:
            yield prefix + name, p
    for name, child in module._modules.items():
        if child is not None:
            yield from all_parameter_uses(child, f"{prefix}{name}.")


_PLAIN = (int, float, bool, complex, str, bytes, type(None), torch.dtype, torch.device,
          torch.Size, slice, type(Ellipsis))


def _holds_tensors(obj, depth=0):
    """Whether a non-tensor leaf (an object torch's pytree does not look into) holds tensors."""
    if depth > 3 or isinstance(obj, _PLAIN):
        return False
    if isinstance(obj, torch.Tensor):
        return True
    if isinstance(obj, torch.nn.Module):  # a module passed in: only trained parameters matter
        return any(p.requires_grad for p in obj.parameters())
    if isinstance(obj, dict):
        return any(_holds_tensors(v, depth + 1) for v in obj.values())
    if isinstance(obj, (list, tuple, set)):
        return any(_holds_tensors(v, depth + 1) for v in obj)
    fields = getattr(obj, "__dict__", None)
    if isinstance(fields, dict):
        return any(_holds_tensors(v, depth + 1) for v in fields.values())
    return False


def _check_leaves(leaves, unit, what):
    for x in leaves:
        if not isinstance(x, torch.Tensor) and _holds_tensors(x):
            hint = (" (a Hugging Face cache: set model.config.use_cache = False, as gradient "
                    "checkpointing does)" if "Cache" in type(x).__name__ else "")
            raise InvalidArgumentError(
                f"offload unit {unit}: {what} a {type(x).__name__} holding tensors{hint}; a unit's "
                "tensors must come in tensors, tuples, lists or dicts, so that its recomputation "
                "in backward sees the same inputs and autograd sees its outputs")


def _storage_ptr(t):
    try:
        return t.untyped_storage().data_ptr()
    except AttributeError:  # torch 1.13
        return t.storage().data_ptr()


class _Call:
    """One call of a unit: its inputs' structure and what the backward needs to run it again."""

    __slots__ = ("engine", "index", "fn", "leaves", "spec", "tensor_pos", "out_spec",
                 "out_leaves", "out_pos", "rng", "autocast", "params", "shared")

    def run(self, tensors):
        leaves = list(self.leaves)
        for pos, t in zip(self.tensor_pos, tensors):
            leaves[pos] = t
        args, kwargs = tree_unflatten(leaves, self.spec)
        return self.fn(*args, **kwargs)


def _run_checked(call, tensors):
    """Runs the unit on `tensors` (its parameters gathered); the flat output leaves. Refuses an
    in-place change of an input (the recomputation would see other values) and copies outputs
    that view the unit's parameters or are its inputs (parameters are released after the run)."""
    versions = [t._version for t in tensors]
    out = call.run(tensors)
    if any(t._version != v for t, v in zip(tensors, versions)):
        raise InvalidArgumentError(
            f"offload unit {call.engine._unit_paths[call.index]} changed one of its inputs in "
            "place; its backward recomputes it from its inputs, so they must stay as given (use "
            "an out-of-place op, e.g. x = x * 2 instead of x.mul_(2))")
    leaves, spec = tree_flatten(out)
    _check_leaves(leaves, call.engine._unit_paths[call.index], "returns")
    held = {_storage_ptr(p) for p in call.engine._unit_params[call.index] if p.numel() > 0}
    inputs = {id(t) for t in tensors}
    for i, x in enumerate(leaves):
        if isinstance(x, torch.Tensor) and (id(x) in inputs or
                                            (x.numel() > 0 and _storage_ptr(x) in held)):
            leaves[i] = x.clone()
    return leaves, spec


class _UnitFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, call, anchor, *tensors):
        ctx.call = call
        ctx.save_for_backward(*tensors)
        call.rng = torch.get_rng_state()
        call.autocast = _autocast_state()
        c = call.engine._c
        gathered = False
        try:
            c.gather(call.index, True)
            gathered = True
            with torch.no_grad():
                leaves, call.out_spec = _run_checked(call, tensors)
        finally:
            if gathered:
                c.release(call.index)
        call.out_pos = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
        call.out_leaves = [None if isinstance(x, torch.Tensor) else x for x in leaves]
        outs = tuple(leaves[i] for i in call.out_pos)
        non_diff = [t for t in outs if not (t.is_floating_point() or t.is_complex())]
        if non_diff:
            ctx.mark_non_differentiable(*non_diff)
        return outs

    @staticmethod
    def backward(ctx, *grad_outputs):
        call = ctx.call
        engine = call.engine
        inputs = ctx.saved_tensors
        detached = []
        for t in inputs:
            d = t.detach()
            if t.requires_grad:
                d.requires_grad_(True)
            detached.append(d)
        c = engine._c
        params = call.params
        shared = call.shared
        want = [d for d in detached if d.requires_grad]
        try:
            gathered = False
            try:
                c.gather(call.index, True)
                gathered = True
                with torch.enable_grad(), _rng_state(call.rng), _autocast(call.autocast):
                    out = call.run(detached)
                leaves, _ = tree_flatten(out)
                outs = [leaves[i] for i in call.out_pos]
                pairs = [(o, g) for o, g in zip(outs, grad_outputs)
                         if g is not None and isinstance(o, torch.Tensor) and o.requires_grad]
                targets = list(params) + shared + want
                if pairs and targets:
                    grads = torch.autograd.grad([o for o, _ in pairs], targets,
                                                [g for _, g in pairs], allow_unused=True)
                else:
                    grads = [None] * len(targets)
                c.gradients_ready(call.index, list(grads[:len(params)]))
                # Resident parameters the unit also holds (tied weights): their gradient joins
                # the one autograd accumulates from their other uses.
                with torch.no_grad():
                    for p, g in zip(shared, grads[len(params):len(params) + len(shared)]):
                        if g is None:
                            continue
                        if p.grad is None:
                            p.grad = g.detach().clone()
                        else:
                            p.grad.add_(g)
            finally:
                if gathered:
                    c.release(call.index)
        except BaseException as e:  # noqa: B902 (KeyboardInterrupt too: engine.backward re-raises it)
            engine._note_hook_error(e)
            raise
        input_grads = iter(grads[len(params) + len(shared):])
        result = [next(input_grads) if d.requires_grad else None for d in detached]
        return (None, None, *result)


@contextlib.contextmanager
def _rng_state(state):
    with torch.random.fork_rng(devices=[]):
        torch.set_rng_state(state)
        yield


def _autocast_state():
    """The CPU autocast state of the forward, for its recomputation (torch.utils.checkpoint's
    rule)."""
    return (torch.is_autocast_cpu_enabled(), torch.get_autocast_cpu_dtype())


@contextlib.contextmanager
def _autocast(state):
    enabled, dtype = state
    with torch.autocast("cpu", enabled=enabled, dtype=dtype):
        yield


_ANCHOR = None


def _anchor():
    # A 0-element leaf that requires grad: the unit's outputs require grad even when no input does
    # (its parameters still need gradients).
    global _ANCHOR
    if _ANCHOR is None:
        _ANCHOR = torch.empty(0, requires_grad=True)
    return _ANCHOR


def run_unit(engine, index, fn, args, kwargs):
    """Runs offload unit ``index``'s original forward ``fn`` under the engine (see the top)."""
    c = engine._c
    params = engine._grad_params[index]
    shared = engine._unit_shared[index]
    leaves, spec = tree_flatten((args, kwargs))
    _check_leaves(leaves, engine._unit_paths[index], "is given")
    tensor_pos = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
    tensors = [leaves[i] for i in tensor_pos]
    call = _Call()
    call.engine = engine
    call.index = index
    call.fn = fn
    call.leaves = [None if isinstance(x, torch.Tensor) else x for x in leaves]
    call.spec = spec
    call.tensor_pos = tensor_pos
    call.params = params
    call.shared = shared
    needs_graph = torch.is_grad_enabled() and (
        bool(params) or bool(shared) or any(t.requires_grad for t in tensors))
    if not needs_graph:
        gathered = False
        try:
            c.gather(index, False)
            gathered = True
            out_leaves, out_spec = _run_checked(call, tensors)
        finally:
            if gathered:
                c.release(index)
        return tree_unflatten(out_leaves, out_spec)
    outs = _UnitFunction.apply(call, _anchor(), *tensors)
    out_leaves = list(call.out_leaves)
    for pos, t in zip(call.out_pos, outs):
        out_leaves[pos] = t
    return tree_unflatten(out_leaves, call.out_spec)


def install(engine, index, module):
    """Wraps ``module.forward`` so that its calls run as offload unit ``index``."""
    original = module.forward
    if getattr(original, "_strata_unit", False):
        raise InvalidArgumentError(
            f"module {type(module).__name__} is already an offload unit of another strata engine; "
            "close() that engine first")
    engine_ref = weakref.ref(engine)  # the model must not keep the engine alive

    def forward(*args, **kwargs):
        e = engine_ref()
        if e is None or e._c is None:
            return original(*args, **kwargs)
        return run_unit(e, index, original, args, kwargs)

    forward._strata_unit = True
    module.forward = forward


def uninstall(module):
    module.__dict__.pop("forward", None)
