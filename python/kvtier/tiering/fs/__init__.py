"""File-system tier ("fs"): block files under a shared or local root directory."""
