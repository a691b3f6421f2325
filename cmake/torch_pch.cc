// The one source of strata_torch_pch_pic/_pie (cmake/StrataTorchPch.cmake): those targets exist to
// build the precompiled <torch/torch.h> that the torch-including sources of other targets reuse.
