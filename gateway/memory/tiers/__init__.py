"""Memory tiers: each a pure selection over plain data."""
