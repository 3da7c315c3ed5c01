"""Summarization: the model's work on a job, through the ChatModel port it is given."""
