"""patroller.http."""
