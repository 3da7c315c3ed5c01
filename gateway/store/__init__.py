"""Redis: the key schema, the store, and the embedded server. The only redis imports."""
