"""The in-process engine (``policy.engine: local``): batched decoding of a
transformers model on this process's device (``engine``), the state of one
request (``group``), one decoding step (``decode``), token sampling
(``token_sampling``) and pinned older weight versions (``versions``).
``asyncrl.engines.LocalEngine`` imports it on first use."""
