"""Text models that run in-process: token counting (tiktoken) and word vectors (wordllama)."""
