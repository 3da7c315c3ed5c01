"""Memory: plain data and pure policies over it. The IO that executes their effects is
``gateway.service`` (and the worker); nothing here imports the store, an HTTP client,
the metrics or the request context (checked by import-linter)."""
