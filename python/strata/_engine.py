"""strata.initialize and the engine object it returns (DeepSpeed's ``deepspeed.initialize``)."""

import contextlib
import io
import json
import os
import pickle
import signal
import threading
import warnings
import weakref

import torch

from . import _units
from .errors import FailedPreconditionError, InvalidArgumentError, StrataError, _from_status

try:
    from . import _C
except ImportError as e:  # pragma: no cover - a package installed without its module
    raise ImportError(
        "strata's compiled module (strata._C) is missing or was built for another PyTorch: "
        f"{e}. Reinstall from the clone: pip install --no-build-isolation ."
    ) from e


def _read_config(config):
    """(text, source) of a config given as a dict, a JSON text or a path."""
    if config is None:
        raise InvalidArgumentError("strata.initialize: no config (config=dict or path)")
    if isinstance(config, dict):
        try:
            return json.dumps(config), "config"
        except (TypeError, ValueError) as e:
            raise InvalidArgumentError(f"config: not JSON-serializable: {e}") from None
    if isinstance(config, (str, os.PathLike)):
        path = os.fspath(config)
        if isinstance(config, str) and config.lstrip().startswith("{"):
            return config, "config"
        # The command's reader: a regular file of bounded size (a FIFO or /dev/zero is refused,
        # not read until memory runs out).
        data = _C.read_config_file(path)
        try:
            return data.decode("utf-8"), path
        except UnicodeDecodeError as e:
            raise InvalidArgumentError(
                f"{path}: not UTF-8 text (byte {e.start}: {data[e.start:e.start + 1]!r})") from None
    raise InvalidArgumentError(
        f"config: expected a dict or a path, got {type(config).__name__}")


_OPTIMIZER_TYPES = {torch.optim.AdamW: "AdamW", torch.optim.Adam: "Adam",
                    torch.optim.Adagrad: "Adagrad"}


def _optimizer_section(optimizer):
    """A torch optimizer given to initialize, as the config's "optimizer" section."""
    kind = _OPTIMIZER_TYPES.get(type(optimizer))
    if kind is None:
        raise InvalidArgumentError(
            f"optimizer {type(optimizer).__name__}: strata's CPU optimizer runs Adam, AdamW, "
            "Adagrad and Lion; name one in the config's \"optimizer\" section")
    groups = optimizer.param_groups
    if len(groups) != 1:
        raise InvalidArgumentError(
            f"optimizer with {len(groups)} parameter groups: strata applies one set of "
            "hyperparameters; use one group")
    g = groups[0]
    params = {"lr": g["lr"], "eps": g["eps"], "weight_decay": g["weight_decay"]}
    if kind != "Adagrad":
        params["betas"] = list(g["betas"])
    if kind == "Adam" and g.get("weight_decay", 0):
        params["adam_w_mode"] = False
    return {"type": kind, "params": params}


def _load_client_state(data, path, trust):
    """The client_state pickled in checkpoint `path`: weights_only unless `trust` (see
    StrataEngine.load_checkpoint)."""
    where = f"the client_state of checkpoint {path}"
    if trust:
        warnings.warn(f"strata: unpickling {where} with weights_only=False "
                      "(trust_client_state=True): a hostile checkpoint runs code here",
                      stacklevel=3)
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)
    try:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        named = [ln for ln in lines if "Unsupported global" in ln or "GLOBAL" in ln]
        first = (named or lines or [type(e).__name__])[0]
        raise InvalidArgumentError(
            f"{where} holds objects beyond tensors, numbers, strings and containers ({first}); "
            "unpickling them would run code from the checkpoint. Allow their types with "
            "torch.serialization.add_safe_globals, or pass load_checkpoint(..., "
            "trust_client_state=True) for a checkpoint you trust") from None
    except Exception as e:  # a damaged pickle: not a strata crash
        raise InvalidArgumentError(f"{where} cannot be read: {type(e).__name__}: {e}") from None


def _warn(info):
    for w in info["warnings"]:
        warnings.warn(f"strata: {w}", stacklevel=4)


@contextlib.contextmanager
def _sigint_deferred():
    """Ctrl-C during an engine call takes effect when the call has ended, so the engine is in a
    consistent state (a micro-batch's gradients all handed off or none) when KeyboardInterrupt
    is raised. A second Ctrl-C raises at once."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if previous is None or previous is signal.SIG_IGN:
        yield
        return
    caught = []

    def note(signum, frame):
        if caught:
            raise KeyboardInterrupt
        caught.append((signum, frame))

    signal.signal(signal.SIGINT, note)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught:
        if previous is signal.default_int_handler or previous is signal.SIG_DFL:
            raise KeyboardInterrupt
        previous(*caught[0])


def _size(value, what):
    """A memory size keyword (bytes as an int, or "4G"), range-checked by the same function as the
    command's --host-memory and friends."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise InvalidArgumentError(
            f"{what}: expected a byte count or a size such as '4G', got {type(value).__name__}")
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise InvalidArgumentError(f"{what}: {value} is not a finite size")
        if value != int(value):
            raise InvalidArgumentError(f"{what}: {value} is not a whole number of bytes")
        value = int(value)
    return _C.byte_size(str(value), what)


def _partition(model, units):
    """(units, each unit's [(name in the unit, parameter)], resident [(name, parameter)], engine
    names that differ from the model's).

    Every holder of every parameter counts: a parameter held by two units, or by a unit and a
    module outside the units (tied embeddings), is resident (gathered by no unit); a unit left
    without parameters of its own is no unit. A resident parameter is named by its first holder
    outside the units; one held by units only gets a name outside them (_shared.<name>), the name
    checkpoints and the safetensors export use (fp32_state_dict() gives the model's).
    """
    uses = {}
    order = []
    for name, p in _units.all_parameter_uses(model):
        if id(p) not in uses:
            uses[id(p)] = (p, [])
            order.append(id(p))
        uses[id(p)][1].append(name)
    while True:
        prefixes = [(path + ".", i) for i, (path, _) in enumerate(units)]

        def unit_of_name(name):
            for prefix, i in prefixes:
                if name.startswith(prefix):
                    return i
            return None

        unit_params = [[] for _ in units]
        resident = []
        engine_names = {}
        for key in order:
            p, names = uses[key]
            owners = {unit_of_name(n) for n in names}
            if len(owners) == 1 and None not in owners:
                i = owners.pop()
                unit_params[i].append((names[0][len(units[i][0]) + 1:], p))
            else:
                outside = [n for n in names if unit_of_name(n) is None]
                name = outside[0] if outside else "_shared." + names[0].replace(".", "__")
                resident.append((name, p))
                if name != names[0]:
                    engine_names[name] = names[0]
        kept = [i for i in range(len(units)) if unit_params[i]]
        if len(kept) == len(units):
            return units, unit_params, resident, engine_names
        units = [units[i] for i in kept]


class StrataEngine:
    """The model under strata's engine. Train it as DeepSpeed's engine is trained::

        loss = engine(batch)        # the model's forward
        engine.backward(loss)
        engine.step()               # updates at the accumulation boundary

    Threads: use it from one thread. Parameters of offload units are empty tensors between their
    uses (as under DeepSpeed ZeRO-3); read values with ``fp32_state_dict()``.
    """

    def __init__(self, model, config_text, config_source, options, materializer=None,
                 unit_classes=None):
        self._start(model)
        if materializer is not None:  # built under strata.init
            materializer.materialize()
        units, unit_params, resident, self._engine_names = _partition(
            model, _units.find_units(model, unit_classes))
        initialize_unit = None
        if materializer is not None:  # built under strata.init
            materializer.prepare(units)
            initialize_unit = materializer.unit
        for name, p in resident + [x for params in unit_params for x in params]:
            if p.numel() == 0 and p.dim() == 1 and p.requires_grad:
                raise InvalidArgumentError(
                    f"parameter {name} is empty: its values went to a strata engine (closed "
                    "now, or still alive); build the model again, or load its values, before "
                    "initialize")
            if p.dtype != torch.float32 or p.device.type != "cpu":
                with torch.no_grad():
                    p.data = p.data.to(device="cpu", dtype=torch.float32)
        if not resident and not any(unit_params):
            raise InvalidArgumentError(
                f"model {type(model).__name__} has no parameters: nothing to train")
        self._unit_paths = [path for path, _ in units]
        self._units = [m for _, m in units]
        self._unit_params = [list(m.parameters()) for m in self._units]
        options = dict(options)
        options["model_class"] = f"{type(model).__module__}.{type(model).__qualname__}"
        options["config_source"] = config_source
        self._c = _C.Engine([(path, unit_params[i]) for i, (path, _) in enumerate(units)],
                            resident, config_text, json.dumps(options), initialize_unit)
        self._info = self._c.info()
        _warn(self._info)
        self._grad_params = []
        resident_ids = {id(p) for _, p in resident}
        self._unit_shared = []
        for m in self._units:
            seen = set()
            shared = []
            for p in m.parameters():
                if id(p) in resident_ids and p.requires_grad and id(p) not in seen:
                    seen.add(id(p))
                    shared.append(p)
            self._unit_shared.append(shared)
        if self._info["offloaded"]:
            self._grad_params = [self._c.grad_parameters(i) for i in range(len(units))]
            for i, m in enumerate(self._units):
                _units.install(self, i, m)
        weakref.finalize(self, StrataEngine._finalize, self._c, list(self._units))

    def _start(self, module):
        """The state every engine starts with (a model strata built has no Python units)."""
        self.module = module
        self._c = None
        self._hook_error = None
        self._backward_pending = False
        self._micro_steps = 0
        self._units = []
        self._unit_paths = []
        self._unit_params = []
        self._unit_shared = []
        self._grad_params = []
        self._engine_names = {}

    @staticmethod
    def _finalize(c, modules):
        for m in modules:
            _units.uninstall(m)
        c.close()

    # --- training -------------------------------------------------------------------------------

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def forward(self, *args, **kwargs):
        self._check_open()
        with _sigint_deferred():
            return self.module(*args, **kwargs)

    def backward(self, loss, retain_graph=False):
        """Backpropagates ``loss`` (divided by the accumulation steps; times the loss scale in
        fp16) and hands every gradient to the engine. If it fails, the accumulation window's
        gradients are dropped and the window starts again: feed its micro-batches again."""
        self._check_open()
        if retain_graph:
            raise InvalidArgumentError(
                "backward(retain_graph=True): strata hands each unit's gradients off as they are "
                "produced and frees its recomputed graph; a second backward is not supported")
        if not isinstance(loss, torch.Tensor):
            raise InvalidArgumentError(
                f"backward: expected the loss tensor, got {type(loss).__name__}")
        if loss.numel() != 1:
            raise InvalidArgumentError(
                f"backward: the loss must be a scalar, got shape {tuple(loss.shape)}")
        if not loss.requires_grad:
            raise InvalidArgumentError(
                "backward: the loss does not require grad (computed under torch.no_grad(), or "
                "every parameter is frozen)")
        with _sigint_deferred():
            self._hook_error = None
            try:
                self._c.backward(loss)
            except StrataError:
                # The engine dropped the window's gradients and restarted it (engine.h).
                self._micro_steps = self._c.micro_steps
                err, self._hook_error = self._hook_error, None
                if err is not None:
                    try:
                        raise err from None
                    finally:
                        err = None
                raise
            self._backward_pending = True
        return loss

    def step(self, lr_kwargs=None):
        """At the accumulation boundary: clip, update every parameter (an fp16 overflow skips)
        and advance the schedule; a no-op between boundaries. Call it after every backward."""
        self._check_open()
        if not self._backward_pending:
            raise FailedPreconditionError(
                "step() called before backward(): call engine.backward(loss) for each "
                "micro-batch, then engine.step()")
        with _sigint_deferred():
            self._backward_pending = False
            self._micro_steps += 1
            self._c.step()

    def is_gradient_accumulation_boundary(self):
        """Whether the micro-batch being processed (counted by step() calls, as DeepSpeed counts
        it) is the last of its accumulation window: the next step() updates."""
        self._check_open()
        return (self._micro_steps + 1) % self.gradient_accumulation_steps() == 0

    def _note_hook_error(self, e):
        if self._hook_error is None:
            self._hook_error = e

    # --- state ----------------------------------------------------------------------------------

    @property
    def global_steps(self):
        return self._c.global_steps

    @property
    def global_samples(self):
        return self._c.global_steps * self._info["train_batch_size"]

    @property
    def micro_steps(self):
        return self._c.micro_steps

    @property
    def skipped_steps(self):
        return self._c.skipped_steps

    def get_lr(self):
        """The learning rate of the next applied step, one per parameter group (DeepSpeed's)."""
        return [self._c.learning_rate]

    def get_global_grad_norm(self):
        return self._c.last_grad_norm

    @property
    def loss_scale(self):
        return self._c.loss_scale

    def train_batch_size(self):
        return self._info["train_batch_size"]

    def train_micro_batch_size_per_gpu(self):
        return self._info["train_micro_batch_size_per_gpu"]

    def gradient_accumulation_steps(self):
        return self._info["gradient_accumulation_steps"]

    def gradient_clipping(self):
        return self._info["gradient_clipping"]

    @property
    def world_size(self):
        return self._info["world_size"]

    @property
    def global_rank(self):
        return self._info["rank"]

    @property
    def local_rank(self):
        return int(os.environ.get("LOCAL_RANK", "0"))

    @property
    def device(self):
        """Where the model computes: the CPU (the host-emulated device) in this build."""
        return torch.device("cpu")

    @property
    def offload(self):
        """Where parameters and optimizer state live: {"params": ..., "optimizer": ...}."""
        return {"params": self._info["params"], "optimizer": self._info["optimizer"]}

    def telemetry(self):
        """Tier counters: NVMe bytes read and written so far, device peak and budget."""
        return self._c.info()

    def train(self, mode=True):
        self.module.train(mode)
        return self

    def eval(self):
        return self.train(False)

    def parameters(self, recurse=True):
        return self.module.parameters(recurse)

    def named_parameters(self, *args, **kwargs):
        return self.module.named_parameters(*args, **kwargs)

    # --- checkpoints and exports ----------------------------------------------------------------

    def save_checkpoint(self, save_dir, tag=None, client_state=None, save_latest=True):
        """Writes SAVE_DIR/TAG (default "global_step<N>") atomically and points
        SAVE_DIR/latest at it; ``client_state`` (a dict) is pickled beside the engine state and
        returned by load_checkpoint. Every rank calls it. Returns True (DeepSpeed's)."""
        self._check_open()
        if self._backward_pending:
            raise FailedPreconditionError(
                "save_checkpoint between backward() and step(): call step() first")
        if not save_latest:
            warnings.warn("strata: save_latest=False is ignored: `latest` always names the "
                          "newest checkpoint", stacklevel=2)
        client = None
        if client_state is not None:
            buf = io.BytesIO()
            torch.save(client_state, buf)
            client = buf.getvalue()
        self._c.save_checkpoint(os.fspath(save_dir), "" if tag is None else str(tag), client)
        return True

    def load_checkpoint(self, load_dir, tag=None, load_module_strict=True,
                        load_optimizer_states=True, load_lr_scheduler_states=True,
                        load_module_only=False, custom_load_fn=None, trust_client_state=False):
        """Restores LOAD_DIR/TAG (default: the one `latest` names). Returns (path, client_state)
        as DeepSpeed does (client_state {} when none was saved); (None, None) with a warning when
        LOAD_DIR has no `latest` and no tag was named.

        ``client_state`` is unpickled with ``torch.load(weights_only=True)``: tensors, numbers,
        strings and the built-in containers (and what ``torch.serialization.add_safe_globals``
        allows) load; anything else is refused, because unpickling arbitrary objects runs code
        from the checkpoint. ``trust_client_state=True`` loads any object, for a checkpoint whose
        author you trust, with a warning."""
        self._check_open()
        load_dir = os.fspath(load_dir)
        if tag is None and not os.path.exists(os.path.join(load_dir, "latest")):
            warnings.warn(f"strata: no checkpoint to load in {load_dir} (no `latest`)",
                          stacklevel=2)
            return None, None
        if not (load_optimizer_states and load_lr_scheduler_states and load_module_strict) or \
                load_module_only or custom_load_fn is not None:
            raise InvalidArgumentError(
                "load_checkpoint: strata restores the whole engine state (parameters, optimizer "
                "state and schedule together, strictly)")
        loaded_tag, client = self._c.load_checkpoint(load_dir, "" if tag is None else str(tag))
        self._backward_pending = False
        self._micro_steps = self._c.micro_steps
        path = os.path.join(load_dir, loaded_tag)
        state = {}
        if client is not None:
            state = _load_client_state(client, path, trust_client_state)
        return path, state

    def fp32_state_dict(self):
        """Every trainable parameter's fp32 value (the optimizer's master weights) on the CPU,
        by the model's names: what DeepSpeed's zero_to_fp32 produces."""
        self._check_open()
        trained = {}
        for name, t in self._c.parameter_values():
            trained[self._engine_names.get(name, name)] = t
        if self.module is None:
            return trained
        # Every key of the model's state_dict: tied aliases, frozen parameters and buffers too,
        # so that model.load_state_dict(sd) works (as with DeepSpeed's zero_to_fp32).
        by_id = {}
        for name, p in self.module.named_parameters():
            if name in trained:
                by_id[id(p)] = trained[name]
        out = {}
        for name, value in _units.all_parameter_uses(self.module):
            if id(value) in by_id:
                out[name] = by_id[id(value)]
            else:
                out[name] = value.detach().to(torch.float32).clone()
        for name, b in self.module.named_buffers():
            leaf = name.rsplit(".", 1)[-1]
            owner = self.module.get_submodule(name.rsplit(".", 1)[0]) if "." in name else self.module
            if leaf in getattr(owner, "_non_persistent_buffers_set", ()):
                continue
            out[name] = b.detach().clone()
        return out

    def save_fp32_safetensors(self, path):
        """Writes every trainable parameter as fp32 into one safetensors file, streamed one
        unit at a time."""
        self._check_open()
        self._c.export_safetensors(os.fspath(path))

    def close(self):
        """Gives the engine's memory and swap files back; the model's unit parameters stay
        empty. Also done when the engine object is collected."""
        if self._c is None:
            return
        for m in self._units:
            _units.uninstall(m)
        c, self._c = self._c, None
        c.close()

    destroy = close

    def _check_open(self):
        if self._c is None:
            raise FailedPreconditionError("this strata engine was closed")


class CausalLMOutput:
    """What a from_pretrained engine's forward returns (as transformers' CausalLMOutput):
    ``loss`` when labels were given, ``logits`` when they were not."""

    def __init__(self, loss=None, logits=None):
        self.loss = loss
        self.logits = logits

    def __getitem__(self, i):
        return tuple(x for x in (self.loss, self.logits) if x is not None)[i]


class PretrainedEngine(StrataEngine):
    """strata.from_pretrained's engine: a model strata builds itself (a Hugging Face Llama,
    Mistral or Qwen2 directory streamed into the tiers unit by unit, or a preset), trained with
    the same calls as StrataEngine. ``engine(input_ids, labels=input_ids)`` computes the loss as
    transformers does (labels shifted inside; -100 ignored)."""

    def __init__(self, model, config_text, config_source, options):
        self._start(None)
        options = dict(options)
        options["config_source"] = config_source
        self._c = _C.Engine(os.fspath(model), config_text, json.dumps(options))
        self._info = self._c.info()
        _warn(self._info)
        self.config = self._c.model_info()
        weakref.finalize(self, StrataEngine._finalize, self._c, [])

    def forward(self, input_ids=None, labels=None, attention_mask=None, **kwargs):
        self._check_open()
        if input_ids is None:
            raise InvalidArgumentError("forward: input_ids is required")
        if kwargs:
            raise InvalidArgumentError(
                f"forward: unsupported arguments {sorted(kwargs)} (input_ids, labels, "
                "attention_mask of ones)")
        if attention_mask is not None and not bool(torch.all(attention_mask == 1)):
            raise InvalidArgumentError(
                "forward: padding (an attention_mask with zeros) is not supported; mark padded "
                "label positions -100 instead")
        ids = input_ids.long()
        with _sigint_deferred():
            if labels is None:
                return CausalLMOutput(logits=self._c.logits(ids))
            return CausalLMOutput(loss=self._c.loss(ids[:, :-1], labels.long()[:, 1:]))

    def train(self, mode=True):
        return self

    def save_pretrained(self, save_directory, dtype=None, max_shard_size="5GB"):
        """Writes a Hugging Face directory transformers loads (safetensors shards, config.json,
        the tokenizer files of the input), streamed unit by unit; ``dtype``: fp32, bf16 or fp16
        (default: each tensor as the input had it)."""
        self._check_open()
        self._c.save_pretrained(os.fspath(save_directory), dtype or "", str(max_shard_size))


def from_pretrained(model, config, seq_len=None, device_memory=None, pinned_memory=None,
                    host_memory=None, io_backend="auto", seed=1234):
    """A Hugging Face model directory (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM,
    Phi3ForCausalLM, Gemma2ForCausalLM) or a strata preset name, loaded straight into the tiers
    the DeepSpeed ``config`` chooses (host memory holds a few layers at a time, never the model),
    under an engine trained as strata.initialize's is. Returns the engine (a PretrainedEngine)."""
    text, source = _read_config(config)
    options = {"io_backend": io_backend, "seed": int(seed)}
    if seq_len is not None:
        # As the command's --seq-len (flags::SeqLen): a whole number from 1 to 2^20.
        if isinstance(seq_len, bool) or not isinstance(seq_len, int) or \
                not 1 <= seq_len <= 1 << 20:
            raise InvalidArgumentError(
                f"from_pretrained: seq_len={seq_len!r}: expected a whole number from 1 to 1048576")
        options["seq_len"] = seq_len
    for key, value in (("device_memory", device_memory), ("pinned_memory", pinned_memory),
                       ("host_memory", host_memory)):
        size = _size(value, key)
        if size is not None:
            options[key] = size
    return PretrainedEngine(model, text, source, options)


class _ParamGroup(dict):
    def __setitem__(self, key, value):
        if key == "lr":
            raise FailedPreconditionError(
                "the learning rate comes from the config (\"optimizer\" and \"scheduler\" "
                "sections); strata's optimizer does not read param_groups")
        super().__setitem__(key, value)


class _OptimizerView:
    """What initialize returns as the optimizer: the engine steps it (engine.step())."""

    def __init__(self, engine):
        self._engine = weakref.proxy(engine)

    @property
    def param_groups(self):
        module = self._engine.module
        params = [p for p in module.parameters() if p.requires_grad] if module is not None else []
        return [_ParamGroup(params=params, lr=self._engine.get_lr()[0])]

    def zero_grad(self, set_to_none=True):
        """No-op: the engine hands gradients off as they are produced."""

    def step(self, closure=None):
        raise FailedPreconditionError("the optimizer is stepped by engine.step()")


class _SchedulerView:
    """What initialize returns as the lr scheduler when the config has a "scheduler" section:
    the engine advances it at each applied step."""

    def __init__(self, engine):
        self._engine = weakref.proxy(engine)

    def get_last_lr(self):
        return self._engine.get_lr()

    get_lr = get_last_lr

    def step(self, *args, **kwargs):
        """No-op: the engine advances the schedule at each applied step."""


def initialize(args=None, model=None, optimizer=None, model_parameters=None, training_data=None,
               lr_scheduler=None, config=None, config_params=None, collate_fn=None,
               device_memory=None, pinned_memory=None, host_memory=None, io_backend="auto",
               dist_init_required=None, mpu=None):
    """DeepSpeed's ``initialize`` over strata's engine.

    Returns ``(engine, optimizer, dataloader, lr_scheduler)``: the engine wraps ``model``; the
    optimizer and the scheduler are views the engine steps (the optimizer comes from the config's
    "optimizer" section, or from ``optimizer`` when it is a torch Adam/AdamW/Adagrad); the
    dataloader is built over ``training_data`` (None without it).

    ``device_memory``: the device budget (bytes or "8G"; default: everything fits);
    ``pinned_memory``, ``host_memory``: the pinned arena's size and the host budget.
    """
    if model is None:
        raise InvalidArgumentError("strata.initialize: model= is required")
    if not isinstance(model, torch.nn.Module):
        raise InvalidArgumentError(
            f"strata.initialize: model must be a torch.nn.Module, got {type(model).__name__}")
    if config is None:
        config = config_params
    if config is None and args is not None and getattr(args, "deepspeed_config", None):
        config = args.deepspeed_config
    if lr_scheduler is not None:
        raise InvalidArgumentError(
            "strata.initialize: lr_scheduler objects are not supported; give the schedule in "
            "the config's \"scheduler\" section (WarmupLR, WarmupDecayLR, WarmupCosineLR, "
            "OneCycle, ...)")
    text, source = _read_config(config)
    options = {"io_backend": io_backend}
    if optimizer is not None:
        section = _optimizer_section(optimizer)
        parsed = json.loads(text)
        if "optimizer" in parsed:
            raise InvalidArgumentError(
                f"{source}: has an \"optimizer\" section and initialize was given an optimizer "
                "too; keep one")
        parsed["optimizer"] = section
        text = json.dumps(parsed)
    hidden = getattr(getattr(model, "config", None), "hidden_size", None)
    if isinstance(hidden, int):
        options["hidden_size"] = hidden
    if training_data is not None and hasattr(training_data, "batch_size") and \
            isinstance(getattr(training_data, "batch_size"), int):
        options["micro_batch"] = training_data.batch_size
    for key, value in (("device_memory", device_memory), ("pinned_memory", pinned_memory),
                       ("host_memory", host_memory)):
        size = _size(value, key)
        if size is not None:
            options[key] = size
    parsed_config = _C.parse_config(text, json.dumps(options))
    if model_parameters is not None:
        chosen = set()
        for item in model_parameters:
            if isinstance(item, dict):  # a parameter group
                chosen.update(id(p) for p in item.get("params", []))
            else:
                chosen.add(id(item))
        for name, p in model.named_parameters():
            if p.requires_grad and id(p) not in chosen:
                p.requires_grad_(False)
    hf_config = getattr(model, "config", None)
    if getattr(hf_config, "use_cache", False):
        # Each unit's backward recomputes its forward: a key/value cache would be extended twice
        # (what transformers does under gradient checkpointing too).
        hf_config.use_cache = False
        warnings.warn("strata: model.config.use_cache set to False (offload units recompute "
                      "their forward in backward)", stacklevel=2)
    from ._init import materializer
    engine = StrataEngine(model, text, source, options, materializer=materializer(model),
                          unit_classes=parsed_config["offload_unit_classes"])
    _follow_precision(model, parsed_config)
    dataloader = None
    if training_data is not None:
        dataloader = _dataloader(training_data, engine, collate_fn)
    scheduler = _SchedulerView(engine) if parsed_config["has_scheduler"] else None
    return engine, _OptimizerView(engine), dataloader, scheduler


def _follow_precision(model, parsed_config):
    """What the engine does not hold follows the compute precision, as DeepSpeed's
    module.bfloat16()/half() does: frozen parameters and floating buffers in bf16; in fp16 (which
    the host-emulated device computes in fp32 on fp16 values) rounded to fp16 values."""
    if not (parsed_config["bf16"] or parsed_config["fp16"]):
        return
    with torch.no_grad():
        for t in [p for p in model.parameters() if not p.requires_grad] + list(model.buffers()):
            if not t.is_floating_point():
                continue
            if parsed_config["bf16"]:
                t.data = t.data.to(torch.bfloat16)
            else:
                t.data = t.data.to(torch.float16).to(torch.float32)


def _dataloader(data, engine, collate_fn):
    from torch.utils.data import DataLoader, DistributedSampler
    sampler = None
    if engine.world_size > 1:
        sampler = DistributedSampler(data, num_replicas=engine.world_size,
                                     rank=engine.global_rank)
    return DataLoader(data, batch_size=engine.train_micro_batch_size_per_gpu(),
                      sampler=sampler, shuffle=sampler is None, collate_fn=collate_fn,
                      drop_last=True)
