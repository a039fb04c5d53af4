"""controllers/router."""
