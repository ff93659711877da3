"""vLLM engines: the in-process ``AsyncLLM`` engine (``policy.engine: vllm``,
``inprocess``) and the ``vllm serve`` servers over HTTP (``server/``), with what
both share: engine arguments and the child-process reaper (``setup``), the
output stream of a request (``stream``), weight transports (``transport``) and
vLLM's own logging (``output``). Importing this package does not import vLLM."""
