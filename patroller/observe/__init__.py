"""patroller.observe."""
