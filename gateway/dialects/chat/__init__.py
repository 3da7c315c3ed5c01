"""The chat-completions dialect whole: its request, content parts, stream watch and answer."""
