"""Code shared by several components."""
