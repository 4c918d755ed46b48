"""lowband experiments as a Flower App (see ../README.md)."""
