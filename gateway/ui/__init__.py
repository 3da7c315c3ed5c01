"""The inspector: server-rendered pages at /ui over the same session operations as the
memory API (``gateway.service.operations``), for an operator holding the admin key."""
