"""memory-gateway: an OpenAI-compatible reverse proxy with long-conversation memory."""

__version__ = "0.1.0"
