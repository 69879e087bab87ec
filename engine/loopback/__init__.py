"""A loopback server speaking the OpenAI and Anthropic HTTP APIs (chat,
streaming, embeddings, files, fine-tuning, batches, prompt caching), for
tests, benchmarks and trying the engine without keys. It is a development
server, not a provider: it sits above the engine core (it counts tokens with
engine/tokens.py) and below the CLI. See engine/loopback/server.py.
"""
