"""patroller.simulator."""
