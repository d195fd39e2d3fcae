"""patroller.core.leases."""
