"""The upstream side: HTTP client (the only httpx import), SSE and header rules."""
