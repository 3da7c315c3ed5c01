"""API dialects: what differs between the chat-completions and Responses APIs."""
