"""workers/sim."""
