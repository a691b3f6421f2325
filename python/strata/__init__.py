"""strata: DeepSpeed's ZeRO-Offload / ZeRO-Infinity for any PyTorch model, on strata's engine.

    import strata
    engine, optimizer, _, scheduler = strata.initialize(model=model, config="ds_config.json")
    for batch in data:
        loss = engine(batch)
        engine.backward(loss)
        engine.step()
    engine.save_checkpoint("ck")

Parameters, gradients and optimizer state live where the DeepSpeed config's zero_optimization
section puts them (device, pinned host memory or NVMe); the optimizer runs on the CPU when it is
offloaded. See the README's "From Python" section.
"""

from . import errors
from ._engine import CausalLMOutput, PretrainedEngine, StrataEngine, from_pretrained, initialize
from ._init import init
from .errors import StrataError

__all__ = ["initialize", "init", "from_pretrained", "StrataEngine", "PretrainedEngine",
           "CausalLMOutput", "StrataError", "errors"]
