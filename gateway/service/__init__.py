"""The memory service: the pure policy of ``gateway.memory`` run against the store and
the models, for one request (prepare, then record) and for an import.

This is the IO edge of memory: the store, the model adapters and the process's caches
are called here (and in the worker); ``gateway.memory`` never imports this package.
"""
