"""Small helpers every layer may use: logging, rank queries, timers."""
