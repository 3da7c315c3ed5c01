"""Memory: plain data, pure policies, and the service that executes their effects."""
