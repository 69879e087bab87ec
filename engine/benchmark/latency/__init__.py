"""The latency benchmark behind `tulving bench`: load shapes (`load`), the
prompts sent (`prompts`), driving the engine and timing the client itself
(`runner`), per-request and per-run figures (`metrics`), and what is printed
and written (`report`, `plots`).

Layer: benchmark (tests/test_layers.py). It drives the real engine
(engine/scheduler.py), so rate limits, the queue and retries apply as in a
run; requests are streamed and bypass the cache (a cached reply is never timed).
"""
