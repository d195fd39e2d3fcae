"""patroller.core."""
