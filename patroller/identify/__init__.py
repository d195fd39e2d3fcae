"""patroller.identify."""
