"""patroller.state."""
