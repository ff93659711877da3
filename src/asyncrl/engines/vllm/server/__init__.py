"""The ``vllm_server`` engine (``policy.engine: vllm_server``): OpenAI-compatible
``vllm serve`` processes driven over HTTP (``engine``); starting them
(``launch``), the HTTP client (``http``), the request and response wire format
(``wire``) and the ASGI middleware that makes them take only this run's key
(``guard``)."""
