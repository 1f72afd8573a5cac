"""factflow.engine."""
