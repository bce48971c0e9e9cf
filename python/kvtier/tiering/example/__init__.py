"""In-memory reference tier ("example")."""
