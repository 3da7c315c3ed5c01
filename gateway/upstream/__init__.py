"""The upstream side: HTTP client (the only aiohttp import), SSE and header rules."""
