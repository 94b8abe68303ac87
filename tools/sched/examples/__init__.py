"""Example jobs for the marble daemon and `marble profile`."""
