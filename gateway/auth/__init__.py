"""Who may use the gateway, and as whom: keys, tenants, identity headers."""
