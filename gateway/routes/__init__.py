"""HTTP routes: the IO edge facing clients."""
