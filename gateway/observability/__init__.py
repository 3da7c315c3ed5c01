"""What every layer reports: Prometheus metrics and the request's log."""
