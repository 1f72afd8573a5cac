"""factflow.model."""
