"""GATI: learned caches that let a request leave the model early (Balasubramanian et al., `gati-learned-caches`).

- `blocks`: a model as a chain of blocks (`load_chain`), for torch.export, TorchScript and nn.Module alike;
- `predictors`, `selectors`: the learned cache's two networks, their losses and the hit threshold;
- `explore`: the exploration phase, `build_cache_set` (`adaserve caches build`);
- `compose`: the composition phase, the paper's integer program and the overall-target composition;
- `cacheset`: versioned cache sets on disk and their loading for serving (`load_cache_set`, `LearnedCache`);
- `cli`: `adaserve caches build | compose | list`.

Nothing is imported here, so the command line stays fast; import the module you need.
"""
