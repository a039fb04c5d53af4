"""streams/signals."""
