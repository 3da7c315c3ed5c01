"""Third-party private APIs the gateway depends on, each fenced behind a version check."""
