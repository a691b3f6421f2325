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

import os as _os
import sys as _sys

# A model's Hugging Face tokenizer runs in a Python process of its own (runtime/data/
# hf_tokenizer.h): this interpreter, which has transformers if the user's script does.
if _sys.executable:
    _os.environ.setdefault("STRATA_PYTHON", _sys.executable)

from . import errors  # noqa: E402
from ._engine import (CausalLMOutput, PretrainedEngine, StrataEngine,  # noqa: E402
                      from_pretrained, initialize)
from ._init import init  # noqa: E402
from .errors import StrataError  # noqa: E402

__all__ = ["initialize", "init", "from_pretrained", "StrataEngine", "PretrainedEngine",
           "CausalLMOutput", "StrataError", "errors"]
