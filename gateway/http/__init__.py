"""The HTTP edge around the routes: the server protocol, middleware, CORS, rate limits."""
