"""What a KV connector does with the cache vLLM registers: LMCache's groups,
chunks and bytes per release (:mod:`kvexplore.connectors.lmcache_layout`)."""
