"""lowband experiments as a Flower App (commands: docs/scale.md in the lowband repository)."""
