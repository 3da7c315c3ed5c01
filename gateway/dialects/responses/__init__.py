"""The Responses API dialect whole: its request, input items, stream watch and answer."""
